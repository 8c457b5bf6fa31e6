"""SIGTERM ends a sharedkv run the way Ctrl-C does: fixtures are torn down, launched
processes stopped, reports written.

CI time limits send SIGTERM (often to the whole process group); Python's default is to die
at once, which skips every teardown. Installed only where the run uses the plugin (a
sharedkv item was collected) and only over the default disposition: a downstream
project's own SIGTERM handling is left alone, and the previous handler comes back at
unconfigure. The first SIGTERM raises KeyboardInterrupt in the main thread; later ones
are ignored so that they cannot cut the teardown short (the supervisor's watchdogs stop
what is left if the process is killed after all).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import pytest

PREVIOUS = pytest.StashKey[Any]()


class _Handler:
    def __init__(self) -> None:
        self.fired = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.fired:
            return
        self.fired = True
        raise KeyboardInterrupt(f"{signal.Signals(signum).name}: tearing down as for Ctrl-C")


def install(config: pytest.Config) -> bool:
    """Turn SIGTERM into KeyboardInterrupt for this run, if nobody else handles it."""
    if PREVIOUS in config.stash or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    config.stash[PREVIOUS] = signal.signal(signal.SIGTERM, _Handler())
    return True


def restore(config: pytest.Config) -> None:
    previous = config.stash.get(PREVIOUS, None)
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)
        del config.stash[PREVIOUS]
