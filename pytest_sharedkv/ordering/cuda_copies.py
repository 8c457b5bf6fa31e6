"""The negative control and the three controls, on the probe's own buffers.

* ``raw_cudamemcpy``: ``cudaMemcpy(dst, src, n, cudaMemcpyDefault)`` with no stream: what
  LMCache's torch fallback does. It must fail under delay, or the probe is blind.
* three ways to restore ordering on the same buffers: synchronize the current stream
  first; ``cudaMemcpyAsync`` on the current stream; a stream-aware tensor ``copy_``.
"""

from __future__ import annotations

import ctypes

import torch

from pytest_sharedkv.host.cudart import CUDA_MEMCPY_DEFAULT, check, cudart
from pytest_sharedkv.ordering.probe import StreamBackend, SymmetricCopy


class _PointerCopy(SymmetricCopy):
    def __init__(self, backend: StreamBackend, sizes: tuple[int, ...]) -> None:
        self.lib = cudart()


class RawCudaMemcpy(_PointerCopy):
    description = "cudaMemcpy(dst, src, n, cudaMemcpyDefault): no stream argument"

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        check(self.lib.cudaMemcpy(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()),
                                  ctypes.c_size_t(src.nbytes), CUDA_MEMCPY_DEFAULT), "cudaMemcpy")


class SyncThenCudaMemcpy(RawCudaMemcpy):
    description = "torch.cuda.current_stream().synchronize(), then the raw cudaMemcpy"

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        torch.cuda.current_stream().synchronize()
        super().copy(dst, src)


class CudaMemcpyAsyncCurrentStream(_PointerCopy):
    description = "cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, current stream)"

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst.data_ptr()),
                                       ctypes.c_void_p(src.data_ptr()),
                                       ctypes.c_size_t(src.nbytes), CUDA_MEMCPY_DEFAULT, stream),
              "cudaMemcpyAsync")


class TensorCopy(_PointerCopy):
    description = "dst.copy_(src, non_blocking=True) on the current stream"

    def __init__(self, backend: StreamBackend, sizes: tuple[int, ...]) -> None:
        pass

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)
