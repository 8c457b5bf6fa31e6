"""LMCache's own copy paths, called exactly as LMCache calls them (0.5.3 and 0.5.6 alike:
names that moved between releases are found through ``host.lmcache_api``).

* ``TorchFallbackCopy``: ``torch_ops``'s ``lmcache_memcpy_async`` (0.5.6 keeps it in
  ``torch_ops.mem_kernels``) in pointer mode: a ctypes ``cudaMemcpy`` with no stream.
* ``DeviceOpsCopy``: whatever LMCache's DeviceOps ``lmcache_memcpy_async`` resolves to
  (``host.lmcache_status.device_ops``: ``lmcache.device_ops``, or 0.5.3's
  ``resolve_device_ops``): the compiled kernel (``cuda_ops``; 0.5.3's ``c_ops``;
  ``cudaMemcpyAsync`` on the current stream) when it loaded, else the fallback above. Where
  it loaded, ``TorchFallbackCopy`` is a reference, not the path under test.
* ``LazyHelperCopy`` / ``MixedHelperCopy``: ``lmcache.v1.gpu_connector.gpu_ops``
  ``lmcache_memcpy_async_{d2h,h2d}`` on memory objects from a real ``LazyMemoryAllocator``
  (the server's default, ``--l1-use-lazy``) or ``MixedMemoryAllocator`` (``--no-l1-use-lazy``).
* ``DiscoveredHelperCopy``: any other ``gpu_ops`` helper that reaches
  ``lmcache_memcpy_async`` (``lmcache_source.memcpy_helpers``), on either allocator, called
  with its arguments bound by name (a ranged helper gets the whole range).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from pytest_sharedkv.ordering.probe import StreamBackend

POOL_ALIGN = 64 << 20  # LazyMemoryAllocator.PIN_CHUNK_SIZE: its pool is a multiple of this


def _device_ops() -> Any:
    """LMCache's DeviceOps instance, for 0.5.3 (resolve_device_ops) and 0.5.4 on alike."""
    import lmcache

    from pytest_sharedkv.host.lmcache_status import bound_device_ops

    ops = bound_device_ops(lmcache)
    if ops is None:
        raise RuntimeError(f"lmcache {getattr(lmcache, '__version__', '?')}: neither "
                           "lmcache.device_ops nor lmcache.v1.platform.resolve_device_ops")
    return ops


def compiled_name() -> str:
    """The compiled extension this LMCache ships (cuda_ops or 0.5.3's c_ops)."""
    import lmcache

    from pytest_sharedkv.host.lmcache_status import compiled_module

    return compiled_module(lmcache) or "lmcache.cuda_ops"


def native_bound() -> bool:
    """True when LMCache's compiled extension replaced the torch fallback on its DeviceOps."""
    from pytest_sharedkv.host.lmcache_status import kernels_bound

    return kernels_bound(_device_ops())


def _direction(name: str) -> Any:
    from pytest_sharedkv.host.lmcache_api import direction

    return direction(name)


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
        from pytest_sharedkv.host.lmcache_api import resolve

        return resolve("fallback lmcache_memcpy_async")


class DeviceOpsCopy(_PointerFunctionCopy):
    def resolve(self) -> Any:
        module = compiled_name()
        if native_bound():
            self.description = (f"lmcache.device_ops.lmcache_memcpy_async -> compiled "
                                f"{module} (cudaMemcpyAsync on the current stream)")
        else:
            self.description = (f"lmcache.device_ops.lmcache_memcpy_async -> torch fallback "
                                f"({module} did not load): cudaMemcpy, no stream")
        return _device_ops().lmcache_memcpy_async


def _lazy(nbytes: int) -> tuple[Any, str]:
    from lmcache.v1.memory_allocators.lazy_memory_allocator import LazyMemoryAllocator

    # init == final: the whole pool is registered (pinned) inside __init__.
    path = f"compiled {compiled_name()}" if native_bound() else (
        "torch fallback (cudaMemcpy, no stream)")
    return (LazyMemoryAllocator(nbytes, nbytes),
            f"on a LazyMemoryAllocator object -> device_ops.lmcache_memcpy_async -> {path}")


def _mixed(nbytes: int) -> tuple[Any, str]:
    from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator

    return (MixedMemoryAllocator(nbytes),
            "on a MixedMemoryAllocator object -> tensor copy_(non_blocking=True) on the "
            "current stream")


ALLOCATORS: dict[str, Callable[[int], tuple[Any, str]]] = {"lazy": _lazy, "mixed": _mixed}


class _HelperCopy:
    """Copies through gpu_ops helpers on memory objects of a real LMCache allocator."""

    kind = ""
    what = "gpu_ops helpers"

    def __init__(self, backend: StreamBackend, sizes: tuple[int, ...]) -> None:
        need = sum(-(-n // 4096) * 4096 for n in sizes)
        self.pool_bytes = max(POOL_ALIGN, -(-need // POOL_ALIGN) * POOL_ALIGN)
        self.allocator, how = ALLOCATORS[self.kind](self.pool_bytes)
        self.description = f"{self.what} {how}"
        self.objects: dict[int, Any] = {}

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
    kind = "lazy"


class MixedHelperCopy(_HelperCopy):
    kind = "mixed"


MEMORY_OBJECT_NAMES = ("memory_obj", "mem_obj", "memory_object", "obj")
DEVICE_NAMES = ("gpu_buffer", "gpu_tensor", "device_buffer", "buffer", "tensor")
START_NAMES = ("byte_offset", "offset", "start", "src_offset", "dst_offset")
LENGTH_NAMES = ("nbytes", "num_bytes", "size", "length", "end")


def bind_helper(fn: Callable[..., Any], name: str) -> Callable[[Any, torch.Tensor], None]:
    """A call of FN with (memory object, device tensor), other parameters bound by name:
    offsets 0, lengths the whole buffer; an unknown required parameter is an error."""
    roles: list[tuple[str, str]] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name in MEMORY_OBJECT_NAMES:
            roles.append((param.name, "obj"))
        elif param.name in DEVICE_NAMES:
            roles.append((param.name, "dev"))
        elif param.name in START_NAMES:
            roles.append((param.name, "zero"))
        elif param.name in LENGTH_NAMES:
            roles.append((param.name, "nbytes"))
        elif param.default is inspect.Parameter.empty:
            raise TypeError(f"gpu_ops.{name}{inspect.signature(fn)}: the ordering probe does "
                            f"not know what to pass for {param.name!r}")
    if {r for _, r in roles} < {"obj", "dev"}:
        raise TypeError(f"gpu_ops.{name}{inspect.signature(fn)}: no memory object and device "
                        "buffer parameters to probe it through")

    def call(obj: Any, dev: torch.Tensor) -> None:
        values = {"obj": obj, "dev": dev, "zero": 0, "nbytes": dev.nbytes}
        fn(**{param: values[role] for param, role in roles})

    return call


class DiscoveredHelperCopy(_HelperCopy):
    """A discovered ``gpu_ops`` helper on a Lazy or Mixed allocator's memory objects."""

    def __init__(self, backend: StreamBackend, sizes: tuple[int, ...], helper: str,
                 allocator: str) -> None:
        from lmcache.v1.gpu_connector import gpu_ops

        self.kind = allocator
        self.what = f"gpu_ops.{helper}"
        self.call = bind_helper(getattr(gpu_ops, helper), helper)
        super().__init__(backend, sizes)

    def d2h(self, dev: torch.Tensor, host: torch.Tensor) -> None:
        self.call(self.objects[dev.nbytes], dev)

    def h2d(self, host: torch.Tensor, dev: torch.Tensor) -> None:
        self.call(self.objects[dev.nbytes], dev)
