"""The identity tier (marker ``identity``): everything that changes KV partitions the key,
proven by pairs of cells (the same identity must hit; another must not hit, or must answer
exactly), per stack, across restarts and across LMCache releases (issue 50)."""
