"""Which copy kernels LMCache really runs here: its compiled ``cuda_ops`` or its torch fallback.

LMCache soft-fails when ``lmcache.cuda_ops`` does not load (e.g. a torch ABI mismatch:
"undefined symbol"): it logs one warning and keeps its torch fallback, whose
``lmcache_memcpy_async`` is a plain ``cudaMemcpy`` with no stream. This module finds out
which one is bound, in-process (for the tiers) or in a subprocess
(``python -m pytest_sharedkv.host.lmcache_status``, for the report header, so the controller
never imports torch).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LMCacheStatus:
    lmcache_version: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None
    cuda_available: bool = False
    device_names: tuple[str, ...] = ()
    device_ops: str | None = None  # class of lmcache.device_ops, e.g. CudaDeviceOps
    native_bound: bool = False  # lmcache_memcpy_async rebound to the compiled kernel
    cuda_ops_error: str | None = None  # why `import lmcache.cuda_ops` failed
    error: str | None = None  # lmcache itself did not import

    @property
    def on_torch_fallback(self) -> bool:
        return self.lmcache_version is not None and self.error is None and not self.native_bound

    def describe(self) -> str:
        if self.error is not None:
            return f"lmcache not importable: {self.error}"
        if self.native_bound:
            return "lmcache.cuda_ops loaded: LMCache copies run its compiled kernels"
        why = self.cuda_ops_error or "its copy ops were not rebound"
        return (
            f"lmcache.cuda_ops NOT loaded ({why}): LMCache runs its torch fallback, whose "
            "lmcache_memcpy_async is a cudaMemcpy with no stream (run `pytest -m ordering`)"
        )

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
        ops = getattr(lmcache, "device_ops", None)
        if ops is not None:
            ensure = getattr(ops, "ensure_native", None)
            if callable(ensure):
                ensure()
            values["device_ops"] = type(ops).__name__
            # bind_native sets instance attributes that shadow the class's torch fallback.
            values["native_bound"] = "lmcache_memcpy_async" in vars(ops)
    except Exception as exc:
        return LMCacheStatus(error=_short(exc), **values)  # type: ignore[arg-type]
    try:
        import lmcache.cuda_ops
    except Exception as exc:
        values["cuda_ops_error"] = _short(exc)
    return LMCacheStatus(**values)  # type: ignore[arg-type]


def main() -> int:
    status = probe()
    sys.stdout.write("SHAREDKV-STATUS " + status.to_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
