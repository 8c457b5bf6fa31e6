"""Parent side: run the allocator child with its allocator settings, a timeout, and a clear
message when it dies (a pool larger than the host is killed by the OOM killer). The child is
supervised (``launch.py``): a pinned pool dies with the run, however the run dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_sharedkv.processes.spawn import spawn
from pytest_sharedkv.processes.supervise import group_members

TAG = "SHAREDKV-POOL "
FALLBACK_PATTERNS = (
    "falling back to unpinned",  # LMCache torch fallback (mem_alloc.py)
    "pin_memory failed",  # LMCache lazy allocator, per chunk
    "DMA performance may be degraded",
    "Pinned host allocation failed",
)
HOST_REGISTER_CONF = "pinned_use_cuda_host_register:True,pinned_num_register_threads:16"


@dataclass
class ChildResult:
    data: dict[str, Any] | None
    error: str | None = None
    stderr_tail: list[str] = field(default_factory=list)
    fallback_warnings: list[str] = field(default_factory=list)


def child_env(alloc_conf: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    env.update(extra or {})
    return env


def worker_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest_sharedkv.pinned_pool.worker", *args]


def run_child(argv: Sequence[str], env: Mapping[str, str], timeout: float, what: str
              ) -> ChildResult:
    launch = spawn(list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True)
    proc = launch.proc
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return ChildResult(None, f"{what}: the allocator process did not finish within "
                                     f"{timeout:g}s and was killed", _tail(err))
    finally:
        _stop_group(proc.pid)
        if not group_members(proc.pid):
            launch.forget()
    tail = _tail(err)
    warnings = [line for line in (err or "").splitlines()
                if any(p.lower() in line.lower() for p in FALLBACK_PATTERNS)]
    for line in (out or "").splitlines():
        if line.startswith(TAG):
            return ChildResult(json.loads(line[len(TAG):]), None, tail, warnings)
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        hint = " (the OOM killer, most likely: the pool did not fit in host memory)" \
            if -proc.returncode == signal.SIGKILL else ""
        why = f"{what}: the allocator process died with {name}{hint}"
    else:
        why = f"{what}: the allocator process exited with status {proc.returncode}"
    return ChildResult(None, why, tail, warnings)


def _stop_group(pgid: int) -> None:
    """Whatever the child left in its group (its own children) goes with it."""
    if [p for p in group_members(pgid) if p != pgid]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _tail(text: str | None, lines: int = 8) -> list[str]:
    return [line[:300] for line in (text or "").strip().splitlines()[-lines:]]
