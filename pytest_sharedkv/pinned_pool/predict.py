"""What each route will pin for a request, before anything is allocated (no torch here).

PyTorch's caching host allocator rounds a request up to the next power of two (17 GiB +
1 MiB pins 32 GiB) unless ``pinned_max_round_threshold_mb`` (newer torch) caps rounding.
LMCache's torch-fallback Mixed pool asks torch for ``size + 4096``, so a pool of exactly
2^k bytes becomes a request for 2^(k+1): on a host without that much RAM the pin fails
and LMCache silently falls back to pageable memory.
"""

from __future__ import annotations

PAGE = 4096
LMCACHE_LAZY_CHUNK = 64 << 20

# route -> (what it is, does torch's caching host allocator round it)
ROUTES: dict[str, tuple[str, bool]] = {
    "sharedkv-register": ("the suite's own: anonymous mmap, chunked cudaHostRegister "
                          "from parallel threads", False),
    "torch-pin-memory": ("torch.empty(pin_memory=True) with default settings "
                         "(cudaHostAlloc)", True),
    "torch-host-register": ("torch.empty(pin_memory=True) with pinned_use_cuda_host_register:"
                            "True,pinned_num_register_threads:16", True),
    "lmcache-lazy": ("LMCache LazyMemoryAllocator(n, n): pageable torch buffer + "
                     "cudaHostRegister in 64 MiB chunks (--l1-use-lazy)", False),
    "lmcache-mixed": ("LMCache MixedMemoryAllocator(n) (--no-l1-use-lazy); on its torch "
                      "fallback: torch.empty(n + 4096, pin_memory=True)", True),
}
LMCACHE_ROUTES = ("lmcache-lazy", "lmcache-mixed")


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def torch_request(route: str, nbytes: int) -> int:
    """Bytes the route asks torch's host allocator for."""
    return nbytes + PAGE if route == "lmcache-mixed" else nbytes


def predicted_reservation(route: str, nbytes: int, round_threshold_bytes: int | None = None
                          ) -> int:
    """Host bytes the route will pin (what the budget must hold)."""
    if route == "lmcache-lazy":
        return -(-nbytes // LMCACHE_LAZY_CHUNK) * LMCACHE_LAZY_CHUNK
    if not ROUTES[route][1]:
        return -(-nbytes // PAGE) * PAGE
    request = torch_request(route, nbytes)
    if round_threshold_bytes is not None and request > round_threshold_bytes:
        return request
    return next_power_of_two(request)


def gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"
