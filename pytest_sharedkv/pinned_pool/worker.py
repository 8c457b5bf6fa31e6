"""The allocator child: ``python -m pytest_sharedkv.pinned_pool.worker ROUTE NBYTES`` (or a probe).

Allocates through one route, times it to fully pinned, asks the CUDA runtime about the
first, the last and one address in every 64 MiB of the pool (``cudaPointerGetAttributes``:
``is_pinned()`` on the base alone says nothing about the rest), reads torch's host
allocator statistics, prints one ``SHAREDKV-POOL {json}`` line, frees everything, exits.
Allocator settings (``PYTORCH_CUDA_ALLOC_CONF``) come from the environment the parent sets.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from pytest_sharedkv.host.cudart import cudart

SAMPLE_STRIDE = 64 << 20
CUDA_MEMORY_TYPE_HOST = 1
MADV_HUGEPAGE = 14
REGISTER_CHUNK = 1 << 30


def _bind(lib: ctypes.CDLL) -> None:
    lib.cudaPointerGetAttributes.restype = ctypes.c_int
    lib.cudaPointerGetAttributes.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaHostRegister.restype = ctypes.c_int
    lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cudaHostUnregister.restype = ctypes.c_int
    lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    lib.cudaGetLastError.restype = ctypes.c_int


def sample_offsets(nbytes: int) -> list[int]:
    return sorted({0, nbytes - 1, *range(SAMPLE_STRIDE // 2, nbytes, SAMPLE_STRIDE)})


def pinned_samples(lib: ctypes.CDLL, base: int, nbytes: int) -> tuple[int, int, int | None]:
    """(addresses checked, pinned, first pageable offset)."""
    attributes = (ctypes.c_int * 64)()
    checked = pinned = 0
    first_pageable: int | None = None
    for offset in sample_offsets(nbytes):
        ctypes.memset(attributes, 0, ctypes.sizeof(attributes))
        rc = lib.cudaPointerGetAttributes(attributes, ctypes.c_void_p(base + offset))
        if rc != 0:
            lib.cudaGetLastError()
        checked += 1
        if rc == 0 and attributes[0] == CUDA_MEMORY_TYPE_HOST:
            pinned += 1
        elif first_pageable is None:
            first_pageable = offset
    return checked, pinned, first_pageable


def host_stats() -> dict[str, Any]:
    try:
        return {k: v for k, v in torch.cuda.host_memory_stats().items()
                if "bytes" in k or "alloc" in k}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def torch_reserved(stats: dict[str, Any]) -> int | None:
    for key in ("allocated_bytes.current", "reserved_bytes.current",
                "allocated_bytes.all.current"):
        if isinstance(stats.get(key), int) and stats[key] > 0:
            return int(stats[key])
    return None


class _SharedKVRegister:
    """Anonymous mmap with transparent huge pages advised; parallel first touch (page faults
    scale with threads, ctypes drops the GIL), then ``cudaHostRegister`` of resident 1 GiB
    chunks from the same threads. Pins exactly the pages asked for: no rounding."""

    def __init__(self, lib: ctypes.CDLL, nbytes: int, threads: int) -> None:
        self.lib = lib
        self.map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        libc = ctypes.CDLL(None)
        libc.madvise(ctypes.c_void_p(self.base), ctypes.c_size_t(nbytes), MADV_HUGEPAGE)
        chunks = [(off, min(REGISTER_CHUNK, nbytes - off))
                  for off in range(0, nbytes, REGISTER_CHUNK)]
        self.registered: list[int] = []
        self.errors: list[str] = []
        started = time.perf_counter()
        self._parallel(chunks, threads, self._touch)
        touched = time.perf_counter()
        self._parallel(chunks, threads, self._register)
        self.phases = {"touch_s": touched - started,
                       "register_s": time.perf_counter() - touched}
        self.reserved = sum(size for off, size in chunks if off in self.registered)

    def _touch(self, off: int, size: int) -> None:
        ctypes.memset(ctypes.c_void_p(self.base + off), 0, size)

    def _register(self, off: int, size: int) -> None:
        rc = self.lib.cudaHostRegister(ctypes.c_void_p(self.base + off), size, 0)
        if rc == 0:
            self.registered.append(off)
        else:
            self.errors.append(f"cudaHostRegister(+{off}, {size}) -> CUDA error {rc}")

    @staticmethod
    def _parallel(chunks: list[tuple[int, int]], threads: int,
                  work: Callable[[int, int], None]) -> None:
        todo = list(reversed(chunks))
        lock = threading.Lock()

        def run() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    off, size = todo.pop()
                work(off, size)

        pool = [threading.Thread(target=run) for _ in range(max(1, threads))]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()

    def close(self) -> None:
        for off in self.registered:
            self.lib.cudaHostUnregister(ctypes.c_void_p(self.base + off))
        self.registered.clear()
        # the exported ctypes view keeps the mapping; the process exit releases it


Allocation = tuple[int, int | None, list[str], Callable[[], None], str]


def allocate(route: str, nbytes: int, threads: int) -> Allocation:
    """(base address, reserved bytes if known, problems, release, timing details)."""
    if route in ("torch-pin-memory", "torch-host-register"):
        tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return tensor.data_ptr(), torch_reserved(host_stats()), [], lambda: None, ""
    if route == "sharedkv-register":
        pool = _SharedKVRegister(cudart(), nbytes, threads)
        phases = ", ".join(f"{k} {v:.1f}" for k, v in pool.phases.items())
        return pool.base, pool.reserved, pool.errors, pool.close, phases
    if route == "lmcache-lazy":
        from lmcache.v1.memory_allocators.lazy_memory_allocator import LazyMemoryAllocator

        lazy = LazyMemoryAllocator(nbytes, nbytes)  # init == final: pinned inside __init__
        reserved = sum(size for _, size in lazy._pin_record)
        return lazy.get_underlying_buffer().data_ptr(), reserved, [], lazy.close, ""
    if route == "lmcache-mixed":
        from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator

        mixed = MixedMemoryAllocator(nbytes)
        return mixed.buffer.data_ptr(), torch_reserved(host_stats()), [], mixed.close, ""
    raise SystemExit(f"unknown route {route!r}")


def run_route(route: str, nbytes: int, threads: int) -> dict[str, Any]:
    lib = cudart()
    _bind(lib)
    torch.cuda.init()
    torch.cuda.synchronize()
    started = time.perf_counter()
    base, reserved, notes, release, phases = allocate(route, nbytes, threads)
    seconds = time.perf_counter() - started
    checked, pinned, first_pageable = pinned_samples(lib, base, nbytes)
    result = {
        "route": route, "requested": nbytes, "reserved": reserved, "seconds": seconds,
        "gib_per_s": nbytes / (1 << 30) / seconds if seconds > 0 else None,
        "checked": checked, "pinned": pinned, "first_pageable": first_pageable,
        "notes": notes, "phases": phases, "threads": threads, "host_stats": host_stats(),
        "torch": str(torch.__version__),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }
    release()
    return result


def probe_conf() -> dict[str, Any]:
    """Does this torch accept PYTORCH_CUDA_ALLOC_CONF as set (e.g. a pinned_* key)?"""
    try:
        torch.cuda.init()
        torch.empty(4096, dtype=torch.uint8, pin_memory=True)
    except Exception as exc:
        return {"accepted": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return {"accepted": True, "error": None}


def probe_hazard() -> dict[str, Any]:
    """pytorch#192722: with rounding off below the cache limit, may a 200 MiB request be
    handed a cached 150 MiB block? (Run with threshold 128 and cache limit 1024.)"""
    torch.cuda.init()
    first = torch.empty(150 << 20, dtype=torch.uint8, pin_memory=True)
    first_ptr = first.data_ptr()
    del first
    second = torch.empty(200 << 20, dtype=torch.uint8, pin_memory=True)
    reused = second.data_ptr() == first_ptr
    if not reused:
        second.fill_(1)  # the whole request must be writable
    return {"reused_smaller_block": reused, "first": first_ptr, "second": second.data_ptr()}


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: worker ROUTE NBYTES [THREADS] | probe-conf | probe-hazard")
    if argv[0] == "probe-conf":
        out = probe_conf()
    elif argv[0] == "probe-hazard":
        out = probe_hazard()
    else:
        threads = int(argv[2]) if len(argv) > 2 else min(16, os.cpu_count() or 1)
        out = run_route(argv[0], int(argv[1]), threads)
    sys.stdout.write("SHAREDKV-POOL " + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
