"""Which copy kernels LMCache really runs here: its compiled extension or its torch fallback.

LMCache binds a compiled extension onto one ``DeviceOps`` instance per device type:
``lmcache.cuda_ops`` from 0.5.4 on (reached as ``lmcache.device_ops``), ``lmcache.c_ops`` in
0.5.3 (reached through ``lmcache.v1.platform.resolve_device_ops``; ``lmcache.c_ops`` is then
a shim over that instance). Where the extension does not load (a torch ABI mismatch:
"undefined symbol") LMCache logs one warning and keeps its torch fallback, whose
``lmcache_memcpy_async`` is a plain ``cudaMemcpy`` with no stream. This module finds out
which one is bound, in-process (for the tiers) or in a subprocess
(``python -m pytest_sharedkv.host.lmcache_status``, for the report header, so the controller
never imports torch). A layout it does not know is said as unknown, naming what is missing.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LMCacheStatus:
    lmcache_version: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None
    cuda_available: bool = False
    device_names: tuple[str, ...] = ()
    device_ops: str | None = None  # class of lmcache.device_ops, e.g. CudaDeviceOps
    native_bound: bool = False  # lmcache_memcpy_async rebound to the compiled kernel
    cuda_ops_error: str | None = None  # why importing the compiled extension failed
    error: str | None = None  # lmcache itself did not import
    kernel_module: str | None = None  # the compiled extension this version ships
    unknown: str | None = None  # what this version lacks that the probe looks for

    @property
    def kernel_path(self) -> str:
        """compiled | torch-fallback | unknown | not-installed: what two reports compare."""
        if self.error is not None:
            return "not-installed" if self.lmcache_version is None else "unknown"
        if self.unknown is not None:
            return "unknown"
        return "compiled" if self.native_bound else "torch-fallback"

    def key(self) -> str:
        """lmcache-<version>-<path>: names references and reports so paths never mix."""
        module = (self.kernel_module or "").rsplit(".", 1)[-1]
        path = f"compiled-{module}" if self.kernel_path == "compiled" and module else (
            self.kernel_path)
        return f"lmcache-{self.lmcache_version or 'none'}-{path}"

    @property
    def on_torch_fallback(self) -> bool:
        return self.lmcache_version is not None and self.error is None and not self.native_bound

    def describe(self) -> str:
        module = self.kernel_module or "lmcache.cuda_ops"
        if self.error is not None:
            return f"lmcache not importable: {self.error}"
        if self.unknown is not None:
            return (f"lmcache {self.lmcache_version}: kernel path unknown ({self.unknown}); "
                    "the tiers that need LMCache's copy ops say VOID")
        if self.native_bound:
            return (f"{module} loaded: LMCache {self.lmcache_version} copies run its "
                    "compiled kernels")
        why = self.cuda_ops_error or "its copy ops were not rebound"
        return (
            f"{module} NOT loaded ({why}): LMCache {self.lmcache_version} runs its torch "
            "fallback, whose lmcache_memcpy_async is a cudaMemcpy with no stream "
            "(run `pytest -m ordering`)"
        )

    def data(self) -> dict[str, object]:
        """What the JSON report keeps: version, kernel path, extension and why."""
        return {"version": self.lmcache_version, "kernel_path": self.kernel_path,
                "kernel_module": self.kernel_module, "key": self.key(),
                "why": self.cuda_ops_error or self.unknown or self.error}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LMCacheStatus:
        data = json.loads(text)
        data["device_names"] = tuple(data.get("device_names", ()))
        return cls(**data)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


KERNEL_MODULES = ("cuda_ops", "c_ops")  # 0.5.4 on, 0.5.3


def compiled_module(lmcache: Any) -> str | None:
    """The compiled extension this LMCache ships (by its file, without importing it)."""
    for location in getattr(lmcache, "__path__", ()):
        for name in KERNEL_MODULES:
            if any(Path(location).glob(f"{name}*.so")):
                return f"lmcache.{name}"
    return None


def device_ops(lmcache: Any) -> Any:
    """The DeviceOps instance LMCache's copies go through, whatever the version."""
    ops = getattr(lmcache, "device_ops", None)
    if ops is not None:
        return ops
    try:
        from lmcache.v1.platform import resolve_device_ops
    except ImportError:
        return None
    return resolve_device_ops(str(getattr(lmcache, "torch_device_type", "cuda")))


def bound_device_ops(lmcache: Any) -> Any:
    """``device_ops`` with LMCache's compiled kernels bound where they load
    (``ensure_native``), or None where this version has no DeviceOps to find."""
    ops = device_ops(lmcache)
    ensure = getattr(ops, "ensure_native", None)
    if callable(ensure):
        ensure()
    return ops


def kernels_bound(ops: Any) -> bool:
    """Whether the compiled extension replaced the torch fallback on OPS (bind_native sets
    instance attributes that shadow the class's fallback)."""
    return ops is not None and "lmcache_memcpy_async" in vars(ops)


def compiled_bound() -> bool:
    """Whether LMCache's compiled kernels are bound in this process; False where LMCache or
    its DeviceOps cannot be had (then it runs nothing compiled either)."""
    try:
        import lmcache

        return kernels_bound(bound_device_ops(lmcache))
    except Exception:
        return False


def _import_error(module: str) -> str | None:
    """Why the extension did not load: importing its file directly (a shim of the same
    name, as 0.5.3 installs, is bypassed)."""
    import importlib.machinery
    import importlib.util

    package, _, name = module.rpartition(".")
    spec = importlib.machinery.PathFinder.find_spec(
        name, list(getattr(sys.modules.get(package), "__path__", ())))
    if spec is None or spec.loader is None:
        return f"{module}: not found"
    try:
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
    except Exception as exc:
        return _short(exc)
    return None


def probe() -> LMCacheStatus:
    """Import torch and lmcache here and report what is bound (initialises CUDA)."""
    values: dict[str, object] = {}
    try:
        import torch

        values["torch_version"] = str(torch.__version__)
        values["torch_cuda"] = torch.version.cuda
        available = bool(torch.cuda.is_available())
        values["cuda_available"] = available
        if available:
            values["device_names"] = tuple(
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            )
    except Exception as exc:
        return LMCacheStatus(error=f"torch: {_short(exc)}")
    try:
        import lmcache

        values["lmcache_version"] = str(getattr(lmcache, "__version__", "unknown"))
        module = compiled_module(lmcache)
        values["kernel_module"] = module
        ops = bound_device_ops(lmcache)
        if ops is None:
            values["unknown"] = ("neither lmcache.device_ops nor "
                                 "lmcache.v1.platform.resolve_device_ops is there")
        else:
            values["device_ops"] = type(ops).__name__
            values["native_bound"] = kernels_bound(ops)
        if module is None:
            values["cuda_ops_error"] = "no compiled extension (cuda_ops or c_ops) is installed"
        elif not values.get("native_bound"):
            values["cuda_ops_error"] = _import_error(module)
    except Exception as exc:
        return LMCacheStatus(error=_short(exc), **values)  # type: ignore[arg-type]
    return LMCacheStatus(**values)  # type: ignore[arg-type]


def main() -> int:
    status = probe()
    sys.stdout.write("SHAREDKV-STATUS " + status.to_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
