"""The machine the run is on: GPUs (never through CUDA in-process), leases, the shared
runtime directory, the environment header, and what LMCache is installed and which kernels
it runs."""
