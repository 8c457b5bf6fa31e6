"""libcudart through ctypes: the very library torch uses (found in this process's memory
map once CUDA is initialised), so raw ``cudaMemcpy`` calls share torch's context, as
LMCache's own fallback does. Used by the ordering tier's controls and the pinned_pool
tier's page sampling."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from pathlib import Path

import torch

CUDA_MEMCPY_DEFAULT = 4


class CudaError(RuntimeError):
    pass


def _loaded_cudart() -> str | None:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libcudart.so" in path and Path(path).exists():
            return path
    return None


@cache
def cudart() -> ctypes.CDLL:
    torch.cuda.init()
    path = _loaded_cudart() or ctypes.util.find_library("cudart") or "libcudart.so"
    lib = ctypes.CDLL(path)
    lib.cudaMemcpy.restype = ctypes.c_int
    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.cudaMemcpyAsync.restype = ctypes.c_int
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_int, ctypes.c_void_p]
    return lib


def check(code: int, what: str) -> None:
    if code != 0:
        raise CudaError(f"{what} failed with CUDA error {code}")
