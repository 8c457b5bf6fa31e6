"""SIGTERM as Ctrl-C: the handler raises KeyboardInterrupt once, ignores later signals, and
passes the first on to the processes it is told of (an xdist controller's workers)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from pytest_sharedkv.processes.interrupts import _Handler


def test_the_first_sigterm_interrupts_and_reaches_the_forwarded_pids() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        asked: list[int] = []

        def workers() -> list[int]:
            asked.append(1)
            return [child.pid, 2 ** 22 + 12345]  # the second is no process: passed over

        handler = _Handler(forward=workers)
        with pytest.raises(KeyboardInterrupt, match="SIGTERM: tearing down as for Ctrl-C"):
            handler(signal.SIGTERM, None)
        assert child.wait(timeout=10) == -signal.SIGTERM
        handler(signal.SIGTERM, None)  # a later one: no second interrupt, nothing sent
        assert asked == [1]
    finally:
        child.kill()
        child.wait()


def test_without_workers_it_only_interrupts() -> None:
    with pytest.raises(KeyboardInterrupt):
        _Handler()(signal.SIGTERM, None)
