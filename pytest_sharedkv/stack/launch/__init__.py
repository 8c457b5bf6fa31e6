"""How a pair comes to exist: the providers (launched vLLM, external endpoints, the stub),
the stacks a launched pair runs (MP, in-process, native), the SGLang engine, the identity
tier's replica settings, and what each launch is asked for."""
