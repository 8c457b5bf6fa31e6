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


def test_sigint_forwarding_and_what_a_second_signal_does() -> None:
    """SIGINT is passed on as SIGTERM is; a second SIGINT interrupts the controller again
    (a second Ctrl-C) but not a worker, where the group's and the forwarded one meet."""
    sent: list[int] = []

    def workers() -> list[int]:
        sent.append(1)
        return []

    controller = _Handler(forward=workers, signum=signal.SIGINT, again=True)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            controller(signal.SIGINT, None)
    assert sent == [1]
    worker = _Handler(signum=signal.SIGINT, again=False)
    with pytest.raises(KeyboardInterrupt):
        worker(signal.SIGINT, None)
    worker(signal.SIGINT, None)  # ignored


SESSION_START_SLEEPS = """
import os, time

def pytest_sessionstart(session):
    open(os.path.join(os.environ["READY_DIR"], "started"), "w").close()
    time.sleep(60)
"""


def test_an_interrupt_before_the_session_started_still_writes_the_report(
        pytester: pytest.Pytester) -> None:
    """pytest runs no pytest_sessionfinish for a session interrupted while it starts (in a
    plugin's sessionstart, as xdist's creating its workers): the report is written at
    unconfigure, incomplete and naming the signal, and the line says where."""
    import json
    import os
    import time

    pytester.makeconftest(SESSION_START_SLEEPS)
    pytester.makepyfile("def test_x(): pass")
    env = {**os.environ, "READY_DIR": str(pytester.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--sharedkv-json=r.json"],
        cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (pytester.path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, text
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["complete"] is False and "SIGTERM" in data["interrupted"], data["interrupted"]
    assert data["exitstatus"] == pytest.ExitCode.INTERRUPTED
    assert f"JSON report: {pytester.path / 'r.json'}" in text
    assert "Traceback" not in text
