"""The copy-target registry: what the ordering tier probes, declared without importing torch.

A target says what it is (control, negative control, or under test), which backend it
runs on, which packages it needs, and where its implementation lives
(``"module:function"``, imported only when a test runs). Other plugins add targets with
the ``pytest_sharedkv_copy_targets`` hook.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_sharedkv.config.registry import Registry
from pytest_sharedkv.host.lmcache_source import memcpy_helpers
from pytest_sharedkv.report.records import ROLES

DIRECTIONS = ("D2H", "H2D")

LMCACHE_LAZY_REMEDY = (
    "remedy: run the LMCache server with --no-l1-use-lazy (the MixedMemoryAllocator copies "
    "with stream-aware tensor copy_)"
)
COMPILED_WHAT = ("a cuda_ops build that loads against this torch (its lmcache_memcpy_async is "
                 "cudaMemcpyAsync on the current stream)")
REFERENCE_REASON = ("LMCache runs its compiled kernels here; this is the fallback it would use "
                    "if they did not load")


def compiled_remedy(kernel_path: str, module: str, proof: list[str] | None) -> str:
    """The compiled-kernel remedy for a fallback fault, said as PROVEN only where PROOF
    (targets of this run that went through the bound compiled kernels and held every
    check) shows it; never "install" what is already loaded. PROOF None: not known yet
    (a single cell's message, before the run's other targets ran)."""
    if proof:
        return (f"{COMPILED_WHAT}: PROVEN by this run ({module} loaded; "
                f"{', '.join(proof)} stream-ordered through it)")
    if kernel_path != "compiled":
        return f"suggested (no run in hand shows it): install {COMPILED_WHAT}"
    if proof is None:
        return f"{COMPILED_WHAT} ({module} is loaded here)"
    return (f"{COMPILED_WHAT} ({module} is loaded here, but no target of this run showed "
            "its copies stream-ordered)")


def remedy_lines(remedy: str, compiled_for: str, reference: bool, kernel_path: str,
                 module: str, proof: list[str] | None) -> list[str]:
    """What to do about a target that is not stream-ordered (REFERENCE: a fallback that
    LMCache does not run here)."""
    if reference:
        lines = [f"not the path under test: {REFERENCE_REASON} ({module}); if they stopped "
                 "loading (a torch upgrade without a matching build), LMCache would copy "
                 f"this way: keep {compiled_remedy(kernel_path, module, proof)}"]
        if remedy:
            lines.append(f"or {remedy.removeprefix('remedy: ')}")
        return lines
    lines = [remedy] if remedy else []
    if compiled_for and kernel_path != "compiled":
        lines.append(("or " if remedy else "remedy: ")
                     + compiled_remedy(kernel_path, module, proof))
    return lines


@dataclass(frozen=True)
class CopyTarget:
    name: str
    role: str
    summary: str
    factory: str | Callable[..., Any]
    backend: str = "cuda"
    requires: tuple[str, ...] = ()
    remedy: str = ""
    directions: tuple[str, ...] = DIRECTIONS  # a one-way helper is probed one way
    options: tuple[tuple[str, str], ...] = ()  # keyword arguments for the factory
    # The package (e.g. "lmcache") whose compiled kernels replace this code where they
    # load: there the target is a reference (its fault is shown, an xfail), not under test.
    fallback_for: str = ""
    # The package whose compiled kernels (loaded against this torch) would remedy a fault
    # of this target: suggested, or PROVEN where this run shows them stream-ordered.
    compiled_for: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES or self.role == "check":
            raise ValueError(f"copy target {self.name!r}: role must be control, "
                             f"negative-control or under-test, not {self.role!r}")
        if self.fallback_for and self.role != "under-test":
            raise ValueError(f"copy target {self.name!r}: only an under-test target can be "
                             f"a fallback reference (fallback_for), not a {self.role}")
        if not self.directions or set(self.directions) - set(DIRECTIONS):
            raise ValueError(f"copy target {self.name!r}: directions must be among "
                             f"{DIRECTIONS}, not {self.directions!r}")

    def load_factory(self) -> Callable[..., Any]:
        if callable(self.factory):
            factory = self.factory
        else:
            module, _, attr = self.factory.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        return functools.partial(factory, **dict(self.options)) if self.options else factory


class TargetRegistry(Registry[CopyTarget]):
    kind = "copy target"

    def for_backend(self, backend: str) -> list[CopyTarget]:
        return [t for t in self if t.backend == backend]

    def negative_control(self, backend: str) -> CopyTarget:
        for target in self.for_backend(backend):
            if target.role == "negative-control":
                return target
        raise LookupError(f"no negative-control copy target for backend {backend!r}")


_CUDA = "pytest_sharedkv.ordering.cuda_copies"
_LMC = "pytest_sharedkv.ordering.lmcache_copies"
_SIM = "pytest_sharedkv.ordering.simulated"

BUILTIN_TARGETS: tuple[CopyTarget, ...] = (
    CopyTarget("raw-cudamemcpy", "negative-control",
               "cudaMemcpy through ctypes with no stream (what LMCache's torch fallback does)",
               f"{_CUDA}:RawCudaMemcpy"),
    CopyTarget("sync-then-cudamemcpy", "control",
               "synchronize the current stream, then the same raw cudaMemcpy",
               f"{_CUDA}:SyncThenCudaMemcpy"),
    CopyTarget("cudamemcpyasync-current-stream", "control",
               "cudaMemcpyAsync through ctypes on the current stream",
               f"{_CUDA}:CudaMemcpyAsyncCurrentStream"),
    CopyTarget("tensor-copy", "control",
               "stream-aware torch tensor copy_(non_blocking=True)",
               f"{_CUDA}:TensorCopy"),
    CopyTarget("lmcache-fallback", "under-test",
               "lmcache.v1.platform.torch_ops lmcache_memcpy_async (the torch fallback)",
               f"{_LMC}:TorchFallbackCopy", requires=("lmcache",), remedy=LMCACHE_LAZY_REMEDY,
               fallback_for="lmcache", compiled_for="lmcache"),
    CopyTarget("lmcache-device-ops", "under-test",
               "lmcache.device_ops.lmcache_memcpy_async (native cuda_ops if it loaded)",
               f"{_LMC}:DeviceOpsCopy", requires=("lmcache",), remedy=LMCACHE_LAZY_REMEDY,
               compiled_for="lmcache"),
    CopyTarget("lmcache-lazy-helper", "under-test",
               "gpu_ops.lmcache_memcpy_async_{d2h,h2d} on a LazyMemoryAllocator object "
               "(the server's default --l1-use-lazy)",
               f"{_LMC}:LazyHelperCopy", requires=("lmcache",), remedy=LMCACHE_LAZY_REMEDY,
               compiled_for="lmcache"),
    CopyTarget("lmcache-mixed-helper", "under-test",
               "gpu_ops.lmcache_memcpy_async_{d2h,h2d} on a MixedMemoryAllocator object "
               "(--no-l1-use-lazy)",
               f"{_LMC}:MixedHelperCopy", requires=("lmcache",)),
    # The simulated-stream test double: selected only by SHAREDKV_SIMULATED_STREAMS (self-tests).
    CopyTarget("sim-raw", "negative-control", "simulated copy that ignores the stream",
               f"{_SIM}:SimRawCopy", backend="simulated"),
    CopyTarget("sim-ordered", "control", "simulated copy queued on the current stream",
               f"{_SIM}:SimOrderedCopy", backend="simulated"),
    CopyTarget("sim-sync-then-raw", "control", "simulated stream sync, then the raw copy",
               f"{_SIM}:SimSyncThenRawCopy", backend="simulated"),
    CopyTarget("sim-unordered", "under-test", "simulated copy path with the ordering bug",
               f"{_SIM}:SimRawCopy", backend="simulated",
               remedy="remedy: (simulated) queue the copy on the current stream"),
)


CLASSIC_HELPERS = ("lmcache_memcpy_async_d2h", "lmcache_memcpy_async_h2d")  # the *-helper pair
ALLOCATOR_TARGETS = {"lazy": ("LazyMemoryAllocator", "the server's default --l1-use-lazy"),
                     "mixed": ("MixedMemoryAllocator", "--no-l1-use-lazy")}


def discovered_targets() -> list[CopyTarget]:
    """One target per allocator for every other gpu_ops helper that reaches
    lmcache_memcpy_async (newer LMCache routes more copies there), found by reading
    LMCache's source; probed in the direction its name says."""
    targets = []
    for helper in memcpy_helpers():
        if helper.name in CLASSIC_HELPERS:
            continue
        for allocator, (cls, flag) in ALLOCATOR_TARGETS.items():
            targets.append(CopyTarget(
                f"lmcache-{allocator}-{helper.short}", "under-test",
                f"gpu_ops.{helper.name} on a {cls} object ({flag}); found by discovery",
                f"{_LMC}:DiscoveredHelperCopy", requires=("lmcache",),
                remedy=LMCACHE_LAZY_REMEDY if allocator == "lazy" else "",
                compiled_for="lmcache" if allocator == "lazy" else "",
                directions=helper.directions or DIRECTIONS,
                options=(("helper", helper.name), ("allocator", allocator))))
    return targets


def builtin_registry() -> TargetRegistry:
    registry = TargetRegistry()
    for target in (*BUILTIN_TARGETS, *discovered_targets()):
        registry.add(target)
    return registry
