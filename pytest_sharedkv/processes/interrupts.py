"""SIGTERM ends a sharedkv run the way Ctrl-C does: fixtures are torn down, launched
processes stopped, reports written.

CI time limits send SIGTERM (often to the whole process group); Python's default is to die
at once, which skips every teardown. Installed only where the run uses the plugin (a
sharedkv item was collected) and only over the default disposition: a downstream
project's own SIGTERM handling is left alone, and the previous handler comes back at
unconfigure. The first SIGTERM raises KeyboardInterrupt in the main thread; later ones
are ignored so that they cannot cut the teardown short (the supervisor's watchdogs stop
what is left if the process is killed after all). An xdist controller passes its first
SIGTERM on to its workers (``xdist_workers``), which then tear down at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import pytest

PREVIOUS = pytest.StashKey[Any]()


class _Handler:
    def __init__(self, forward: Callable[[], Iterable[int]] | None = None) -> None:
        self.fired = False
        self.forward = forward

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.fired:
            return
        self.fired = True
        for pid in self.forward() if self.forward is not None else ():
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, signum)
        raise KeyboardInterrupt(f"{signal.Signals(signum).name}: tearing down as for Ctrl-C")


def install(config: pytest.Config,
            forward: Callable[[], Iterable[int]] | None = None) -> bool:
    """Turn SIGTERM into KeyboardInterrupt for this run, if nobody else handles it; the
    first one also goes to the pids FORWARD names then (an xdist controller's workers)."""
    if PREVIOUS in config.stash or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    config.stash[PREVIOUS] = signal.signal(signal.SIGTERM, _Handler(forward))
    return True


def restore(config: pytest.Config) -> None:
    previous = config.stash.get(PREVIOUS, None)
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)
        del config.stash[PREVIOUS]
