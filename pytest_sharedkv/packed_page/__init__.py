"""The packed_page tier: every byte of every KV layout survives a cross-replica round trip.

Replica A's paged KV buffers (built at the exact shapes and strides vLLM registers) are
stored through LMCache's own transfer code into memory objects and retrieved into
replica B at other block ids; every byte of every moved page, and every page that must
not move, is compared.
"""
