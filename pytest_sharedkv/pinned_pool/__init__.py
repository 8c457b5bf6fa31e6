"""The pinned_pool tier: is the full host pool really pinned, with the size that was asked?

Every allocation runs in its own subprocess (allocator settings are process-global, and a
pool too big for the host must kill a child, not the test run); the child reports what
it pinned, how fast, and what the CUDA runtime says about sampled pages.
"""
