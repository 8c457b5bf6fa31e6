"""Whether torch can use a CUDA device in this process, and if not, the precise reason.

Called by tier fixtures after the GPU lease has set CUDA_VISIBLE_DEVICES, so a fake or
CPU-only device never produces a hardware result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def cuda_unavailable_reason() -> str | None:
    try:
        import torch
    except Exception as exc:
        return f"torch not importable: {type(exc).__name__}: {exc}"
    if torch.cuda.is_available():
        return None
    build = "a CPU build" if torch.version.cuda is None else (
        f"CUDA {torch.version.cuda}; CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}")
    return f"torch {torch.__version__} sees no CUDA device ({build})"


LAUNCH_BLOCKING_ENV = "CUDA_LAUNCH_BLOCKING"


def launch_blocking(environ: Mapping[str, str] | None = None) -> bool:
    """Whether CUDA_LAUNCH_BLOCKING makes CUDA launches synchronous in this environment
    (then every launch waits for the one before it, and no ordering fault can show)."""
    env = os.environ if environ is None else environ
    return env.get(LAUNCH_BLOCKING_ENV, "").strip() not in ("", "0")
