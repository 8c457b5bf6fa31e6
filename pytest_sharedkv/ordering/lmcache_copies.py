"""LMCache's own copy paths, called exactly as LMCache calls them (lmcache 0.5.6 API).

* ``TorchFallbackCopy``: ``lmcache.v1.platform.torch_ops.mem_kernels.lmcache_memcpy_async``
  in pointer mode: a ctypes ``cudaMemcpy`` with no stream.
* ``DeviceOpsCopy``: whatever ``lmcache.device_ops.lmcache_memcpy_async`` resolves to: the
  compiled ``cuda_ops`` kernel (``cudaMemcpyAsync`` on the current stream) when it loaded,
  else the fallback above.
* ``LazyHelperCopy`` / ``MixedHelperCopy``: ``lmcache.v1.gpu_connector.gpu_ops``
  ``lmcache_memcpy_async_{d2h,h2d}`` on memory objects from a real ``LazyMemoryAllocator``
  (the server's default, ``--l1-use-lazy``) or ``MixedMemoryAllocator`` (``--no-l1-use-lazy``).
"""

from __future__ import annotations

from typing import Any

import torch

from pytest_sharedkv.ordering.probe import StreamBackend

POOL_ALIGN = 64 << 20  # LazyMemoryAllocator.PIN_CHUNK_SIZE: its pool is a multiple of this


def native_bound() -> bool:
    """True when lmcache.cuda_ops replaced the torch fallback on lmcache.device_ops."""
    import lmcache

    ops = getattr(lmcache, "device_ops", None)
    return ops is not None and "lmcache_memcpy_async" in vars(ops)


def _direction(name: str) -> Any:
    from lmcache import lmcache_native

    return getattr(lmcache_native.TransferDirection, name)


def _pin_chunk() -> int:
    from lmcache.v1.memory_allocators.lazy_memory_allocator import LazyMemoryAllocator

    return int(LazyMemoryAllocator.PIN_CHUNK_SIZE)


class _PointerFunctionCopy:
    description = ""

    def __init__(self, backend: StreamBackend, sizes: tuple[int, ...]) -> None:
        self.fn = self.resolve()
        self.alignment = _pin_chunk()
        self.d2h_dir = _direction("D2H")
        self.h2d_dir = _direction("H2D")

    def resolve(self) -> Any:
        raise NotImplementedError

    def host_buffer(self, nbytes: int) -> torch.Tensor | None:
        return None

    def d2h(self, dev: torch.Tensor, host: torch.Tensor) -> None:
        self.fn(host.data_ptr(), dev.data_ptr(), dev.nbytes, self.d2h_dir, 0, self.alignment)

    def h2d(self, host: torch.Tensor, dev: torch.Tensor) -> None:
        self.fn(dev.data_ptr(), host.data_ptr(), dev.nbytes, self.h2d_dir, 0, self.alignment)

    def close(self) -> None:
        pass


class TorchFallbackCopy(_PointerFunctionCopy):
    description = "torch fallback lmcache_memcpy_async: ctypes cudaMemcpy, no stream"

    def resolve(self) -> Any:
        from lmcache.v1.platform.torch_ops import mem_kernels

        return mem_kernels.lmcache_memcpy_async


class DeviceOpsCopy(_PointerFunctionCopy):
    def resolve(self) -> Any:
        import lmcache

        if native_bound():
            self.description = ("lmcache.device_ops.lmcache_memcpy_async -> compiled "
                                "lmcache.cuda_ops (cudaMemcpyAsync on the current stream)")
        else:
            self.description = ("lmcache.device_ops.lmcache_memcpy_async -> torch fallback "
                                "(lmcache.cuda_ops did not load): cudaMemcpy, no stream")
        return lmcache.device_ops.lmcache_memcpy_async


class _HelperCopy:
    """Copies through gpu_ops helpers on memory objects of a real LMCache allocator."""

    description = ""

    def __init__(self, backend: StreamBackend, sizes: tuple[int, ...]) -> None:
        need = sum(-(-n // 4096) * 4096 for n in sizes)
        self.pool_bytes = max(POOL_ALIGN, -(-need // POOL_ALIGN) * POOL_ALIGN)
        self.allocator = self.make_allocator(self.pool_bytes)
        self.objects: dict[int, Any] = {}

    def make_allocator(self, nbytes: int) -> Any:
        raise NotImplementedError

    def host_buffer(self, nbytes: int) -> torch.Tensor | None:
        from lmcache.v1.memory_management import MemoryFormat

        obj = self.allocator.allocate(torch.Size([nbytes]), torch.uint8, MemoryFormat.KV_2LTD)
        if obj is None:
            raise RuntimeError(f"{type(self.allocator).__name__} could not allocate {nbytes} B "
                               f"from a {self.pool_bytes} B pool")
        self.objects[nbytes] = obj
        view: torch.Tensor = obj.raw_tensor.view(torch.uint8)[:nbytes]
        return view

    def d2h(self, dev: torch.Tensor, host: torch.Tensor) -> None:
        from lmcache.v1.gpu_connector.gpu_ops import lmcache_memcpy_async_d2h

        lmcache_memcpy_async_d2h(dev, self.objects[dev.nbytes])

    def h2d(self, host: torch.Tensor, dev: torch.Tensor) -> None:
        from lmcache.v1.gpu_connector.gpu_ops import lmcache_memcpy_async_h2d

        lmcache_memcpy_async_h2d(self.objects[dev.nbytes], dev)

    def close(self) -> None:
        torch.cuda.synchronize()
        for obj in self.objects.values():
            self.allocator.free(obj)
        self.objects.clear()
        self.allocator.close()


class LazyHelperCopy(_HelperCopy):
    def make_allocator(self, nbytes: int) -> Any:
        from lmcache.v1.memory_allocators.lazy_memory_allocator import LazyMemoryAllocator

        # init == final: the whole pool is registered (pinned) inside __init__.
        path = "compiled cuda_ops" if native_bound() else "torch fallback (cudaMemcpy, no stream)"
        self.description = (f"gpu_ops helpers on a LazyMemoryAllocator object -> "
                            f"device_ops.lmcache_memcpy_async -> {path}")
        return LazyMemoryAllocator(nbytes, nbytes)


class MixedHelperCopy(_HelperCopy):
    description = ("gpu_ops helpers on a MixedMemoryAllocator object -> tensor "
                   "copy_(non_blocking=True) on the current stream")

    def make_allocator(self, nbytes: int) -> Any:
        from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator

        return MixedMemoryAllocator(nbytes)
