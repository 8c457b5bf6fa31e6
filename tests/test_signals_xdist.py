"""Signals to an xdist controller: the report survives SIGTERM, and no worker outlives the
controller, however it died (SIGTERM or SIGKILL to its pid, not to its group).

Each case runs an inner ``pytest -n 2`` in its own session, tagged through its environment
(``process_tags``), waits until both workers are inside a sleeping sharedkv test, and
signals the controller alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.process_tags import TAG_ENV, Proc, tagged

# Both workers hold a test; the marker makes them sharedkv items (no gate, no fixture).
SLEEPING = """
import os, time
import pytest

@pytest.mark.ordering
@pytest.mark.parametrize("i", range(4))
def test_sleep(i):
    open(os.path.join(os.environ["READY_DIR"], f"{os.getpid()}-{i}"), "w").close()
    time.sleep(60)
"""

PDEATHSIG = """
import ctypes, signal
import pytest

{mark}
def test_pdeathsig():
    value = ctypes.c_int(0)
    assert ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0) == 0  # PR_GET_PDEATHSIG
    assert value.value == {expected}, f"PDEATHSIG {{value.value}}"
"""


@dataclass
class Inner:
    proc: subprocess.Popen[bytes]
    tag: str
    ready: Path
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def others(self) -> list[Proc]:
        """The inner run's processes other than the controller (its workers)."""
        return [p for p in tagged(self.tag) if p.pid != self.proc.pid]


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@contextlib.contextmanager
def inner_xdist(pytester: pytest.Pytester, *args: str) -> Iterator[Inner]:
    tag = uuid.uuid4().hex
    ready = pytester.mkdir(f"ready-{tag[:8]}")
    pytester.makepyfile(**{f"test_slow_{tag[:8]}": SLEEPING})
    env = {**os.environ, TAG_ENV: tag, "READY_DIR": str(ready), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "pytest", f"test_slow_{tag[:8]}.py", "-n", "2",
            "-p", "no:cacheprovider", f"--basetemp={pytester.path / ('bt-' + tag[:8])}",
            *args]
    log = pytester.path / f"inner-{tag[:8]}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=pytester.path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    inner = Inner(proc, tag, ready, log)
    try:
        assert wait_for(lambda: len(list(ready.iterdir())) >= 2, 120), inner.text()[-3000:]
        time.sleep(1.0)  # the setup reports reach the controller
        yield inner
    finally:
        for p in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_sigterm_to_the_controller_keeps_the_report(pytester: pytest.Pytester) -> None:
    """The controller collects nothing under xdist, yet SIGTERM must end it as Ctrl-C does:
    the JSON report is written, incomplete, naming SIGTERM, and the summary says so."""
    with inner_xdist(pytester, "--sharedkv-json=t.json") as inner:
        os.kill(inner.proc.pid, signal.SIGTERM)
        inner.proc.wait(timeout=60)
        assert inner.proc.returncode == pytest.ExitCode.INTERRUPTED, inner.text()[-3000:]
        report = pytester.path / "t.json"
        assert report.exists(), inner.text()[-3000:]
        data = json.loads(report.read_text())
        assert data["complete"] is False
        assert "SIGTERM" in data["interrupted"]
        assert "INTERRUPTED (KeyboardInterrupt: SIGTERM" in inner.text()


def test_sigterm_reaches_a_controller_activated_by_reports(pytester: pytest.Pytester) -> None:
    """No --sharedkv-* option: the controller learns of sharedkv items from the workers'
    reports, and from then on SIGTERM is the Ctrl-C teardown there too."""
    with inner_xdist(pytester) as inner:
        os.kill(inner.proc.pid, signal.SIGTERM)
        inner.proc.wait(timeout=60)
        assert inner.proc.returncode == pytest.ExitCode.INTERRUPTED, inner.text()[-3000:]
        assert "INTERRUPTED (KeyboardInterrupt: SIGTERM" in inner.text()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_worker_outlives_the_controller(pytester: pytest.Pytester,
                                           sig: signal.Signals) -> None:
    with inner_xdist(pytester, "--sharedkv-json=t.json") as inner:
        workers = inner.others()
        assert len(workers) >= 2, workers
        os.kill(inner.proc.pid, sig)
        inner.proc.wait(timeout=60)
        gone = wait_for(lambda: not inner.others(), 3.0)
        assert gone, f"{len(inner.others())} worker(s) outlived the controller by 3 s: " \
                     f"{inner.others()}\n{inner.text()[-2000:]}"


@pytest.mark.parametrize(("mark", "args", "expected"), [
    pytest.param("", (), 0, id="not-sharedkv"),
    pytest.param("", ("--sharedkv-trials=3",), int(signal.SIGKILL), id="option-given"),
    pytest.param("@pytest.mark.ordering", (), int(signal.SIGKILL), id="sharedkv-item"),
])
def test_only_a_sharedkv_run_ties_its_workers_to_the_controller(
        pytester: pytest.Pytester, mark: str, args: tuple[str, ...], expected: int) -> None:
    """A good citizen: in a run that does not use sharedkv a worker keeps xdist's own
    behaviour (no parent-death signal)."""
    pytester.makepyfile(PDEATHSIG.format(mark=mark, expected=expected))
    result = pytester.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.stdout.str()[-2000:]
    result.assert_outcomes(passed=1)
