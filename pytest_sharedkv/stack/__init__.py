"""The stack under test and how it comes to exist: the LMCache server, the replica pair
over it, providers (launched vLLM, model-free transfer, external endpoints, stub), cache
namespaces, and their shared pytest fixtures."""
