"""SIGTERM ends a sharedkv run the way Ctrl-C does, and an xdist controller passes SIGTERM
and SIGINT on to its workers: fixtures are torn down, launched processes stopped, reports
written.

CI time limits send SIGTERM (often to the whole process group); Python's default is to die
at once, which skips every teardown. A SIGINT sent to the controller alone (not to its
group, as a terminal's Ctrl-C is) reaches no worker: each would wait on execnet's shutdown
instead. Installed only where the run uses the plugin and only over the default
disposition: a downstream project's own handling is left alone, and the previous handler
comes back at unconfigure. The first signal raises KeyboardInterrupt in the main thread.
A later SIGTERM is ignored so that it cannot cut the teardown short (the supervisor's
watchdogs stop what is left if the process is killed after all); so is a later SIGINT in a
worker, where a group's Ctrl-C and the controller's copy of it arrive together. A later
SIGINT to the controller interrupts again, as a second Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, NoReturn

import pytest

PREVIOUS = pytest.StashKey[dict[int, Any]]()
HANDLERS = pytest.StashKey[dict[int, "_Handler"]]()
# The message of the KeyboardInterrupt each signal raises (a SIGINT's is Python's own).
REASONS = {signal.SIGTERM: "SIGTERM: tearing down as for Ctrl-C", signal.SIGINT: ""}


class _Handler:
    def __init__(self, forward: Callable[[], Iterable[int]] | None = None,
                 signum: int = signal.SIGTERM, again: bool = False) -> None:
        self.fired = False
        self.forward = forward
        self.signum = signum
        self.again = again  # a later signal interrupts again (else it is ignored)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.fired:
            if self.again:
                raise KeyboardInterrupt(REASONS.get(signal.Signals(signum), ""))
            return
        self.interrupt(REASONS.get(signal.Signals(signum), ""))

    def interrupt(self, reason: str) -> NoReturn:
        self.fired = True
        for pid in self.forward() if self.forward is not None else ():
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, self.signum)
        raise KeyboardInterrupt(reason)


def install(config: pytest.Config, forward: Callable[[], Iterable[int]] | None = None,
            worker: bool = False) -> bool:
    """Turn SIGTERM into KeyboardInterrupt for this run, and take over SIGINT where it is
    Python's default, if nobody else handles them; the first of each also goes to the pids
    FORWARD names then (an xdist controller's workers). Returns whether it installed."""
    if PREVIOUS in config.stash or threading.current_thread() is not threading.main_thread():
        return False
    previous: dict[int, Any] = {}
    handlers: dict[int, _Handler] = {
        signal.SIGTERM: _Handler(forward),
                signal.SIGINT: _Handler(forward, signal.SIGINT, again=not worker)}
    defaults: dict[int, Any] = {signal.SIGTERM: signal.SIG_DFL,
                                signal.SIGINT: signal.default_int_handler}
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is defaults[signum]:
            previous[signum] = signal.signal(signum, handler)
    config.stash[PREVIOUS] = previous
    config.stash[HANDLERS] = {signum: handlers[signum] for signum in previous}
    return bool(previous)


def interrupt(config: pytest.Config, reason: str) -> None:
    """End the run now as the first SIGTERM would (the workers get SIGTERM), for REASON; a
    run whose SIGTERM is somebody else's is left to end on its own."""
    handler = config.stash.get(HANDLERS, {}).get(signal.SIGTERM)
    if handler is not None and not handler.fired:
        handler.interrupt(reason)


def restore(config: pytest.Config) -> None:
    previous = config.stash.get(PREVIOUS, None)
    if previous is not None and threading.current_thread() is threading.main_thread():
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        del config.stash[PREVIOUS]
        del config.stash[HANDLERS]
