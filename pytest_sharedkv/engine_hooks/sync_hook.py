"""Triage control: a device synchronize before and after every KV transfer operation in
the LMCache server, in a launched process whose environment has ``SHAREDKV_SYNC_LOG``.

If a wrong answer is a stream-ordering race (a copy read or freed before the kernel that
produces it finished, on any stream), draining every stream of every device around each
transfer removes it; a fault that persists is not ordering inside those operations. The
targets are the delay hook's (``SHAREDKV_INJECT_TARGETS`` or its defaults). Every wrapped
call appends a line to the log in the delay hook's format (``delay_hook.read_log`` reads
it), so a cell can prove the control ran in the server (a control that never ran proves
nothing: the cell is VOID).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from pytest_sharedkv.engine_hooks import post_import
from pytest_sharedkv.engine_hooks.delay_hook import TARGETS_ENV, log_call, parse_targets

LOG_ENV = "SHAREDKV_SYNC_LOG"
TAG = "sync"


def synchronize_all() -> None:
    """Wait for every stream of every visible device (not only the current stream)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def wrap(name: str, fn: Callable[..., Any],
         sync: Callable[[], None] = synchronize_all) -> Callable[..., Any]:
    @functools.wraps(fn)
    def synchronized(*args: Any, **kwargs: Any) -> Any:
        log_call(name, LOG_ENV)
        sync()
        try:
            return fn(*args, **kwargs)
        finally:
            sync()

    return synchronized


def install(sync: Callable[[], None] = synchronize_all,
            targets: dict[str, list[str]] | None = None
            ) -> post_import.PostImportFinder | None:
    """Wrap the targets (already imported ones now, the rest as they load)."""
    wanted = targets if targets is not None else parse_targets(os.environ.get(TARGETS_ENV))
    finder = post_import.install(wanted, lambda name, fn: wrap(name, fn, sync), TAG,
                                 verb="synchronizing")
    print("sharedkv-sync: triage control, a device synchronize around each KV transfer",
          file=sys.stderr, flush=True)
    return finder
