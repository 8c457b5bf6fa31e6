"""Whether torch can use a CUDA device in this process, and if not, the precise reason.

Called by tier fixtures after the GPU lease has set CUDA_VISIBLE_DEVICES, so a fake or
CPU-only device never produces a hardware result.
"""

from __future__ import annotations

import os


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
