"""Replica pairs over one shared LMCache pool: the tiny model, the LMCache server, launched
processes, namespaces, and (GPU) fault-sensitivity mode."""
