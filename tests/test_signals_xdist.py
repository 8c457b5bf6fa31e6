"""Signals to an xdist controller: the report survives SIGTERM, also while xdist is still
starting its workers; SIGTERM and SIGINT to the controller alone reach its workers; and no
worker outlives the controller, however it died (SIGTERM, SIGINT or SIGKILL to its pid, not
to its group).

Each case runs an inner ``pytest -n 2`` in its own session, tagged through its environment
(``process_tags``), waits until both workers are inside a sleeping sharedkv test and the
controller has taken both setup reports (or, for the start-up window, until xdist is
inside its session start, making a worker's gateway), and signals the controller alone.
The SIGTERM run with ``--sharedkv-json`` is one run, read by the report test and the worker
test. Timings are benchmarks/signals.py's (workers gone within 3 s of the controller):
these hold outcomes, with limits that only catch a worker that never goes.
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

from tests.conftest import isolate
from tests.process_tags import TAG_ENV, Proc, tagged

# How long a worker may outlive the controller here: only a worker that never goes fails
# (how soon they go is benchmarks/signals.py's, against its 3 s budget).
GONE_LIMIT_S = 60.0

# Both workers hold a test; the marker makes them sharedkv items (no gate, no fixture).
SLEEPING = """
import os, time
import pytest

@pytest.mark.ordering
@pytest.mark.parametrize("i", range(4))
def test_sleep(i):
    open(os.path.join(os.environ["READY_DIR"], f"{os.getpid()}-{i}"), "w").close()
    try:
        time.sleep(60)
    except KeyboardInterrupt as exc:  # what interrupted this worker, for the outer test
        with open(os.path.join(os.environ["READY_DIR"], f"interrupt-{os.getpid()}"), "w") as f:
            f.write(str(exc))
        raise
"""
# The inner project's conftest: the controller marks each setup report it has taken, after
# the plugin's own hook (from then on it knows of the sharedkv items), so the test waits on
# that instead of a fixed second. It also writes down every signal the controller sends
# (the plugin passing one on), and with SLOW_START set, xdist's session start sleeps in
# its first gateway: pytest then runs no pytest_sessionfinish for the interrupted session.
CONTROLLER_MARKS = """
import os
import signal
import time
import pytest

CONFIG = []
_kill = os.kill


def _recording_kill(pid, sig):
    with open(os.path.join(os.environ["READY_DIR"], "sent"), "a") as f:
        f.write(f"{pid} {int(sig)}\\n")
    _kill(pid, sig)


def pytest_configure(config):
    CONFIG.append(config)
    if hasattr(config, "workerinput"):
        open(os.path.join(os.environ["READY_DIR"], f"pid-{os.getpid()}"), "w").close()
    else:
        os.kill = _recording_kill


def pytest_xdist_newgateway(gateway):
    if os.environ.get("SLOW_START"):
        open(os.path.join(os.environ["READY_DIR"], "gateway"), "w").close()
        time.sleep(60)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_logreport(report):
    result = yield
    if report.when == "setup" and not hasattr(CONFIG[0], "workerinput"):
        name = "controller-" + report.nodeid.rsplit("[", 1)[-1].rstrip("]")
        open(os.path.join(os.environ["READY_DIR"], name), "w").close()
    return result
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


def _marks(ready: Path, prefix: str) -> int:
    return sum(1 for p in ready.iterdir() if p.name.startswith(prefix))


def _in_tests(ready: Path) -> int:
    """The tests the workers are in (each writes PID-I as it starts)."""
    return sum(1 for p in ready.iterdir() if p.name.split("-")[0].isdigit())


@contextlib.contextmanager
def inner_xdist(path: Path, *args: str, starting: bool = False,
                source: str = SLEEPING) -> Iterator[Inner]:
    """The inner run of SOURCE (a test module whose tests each write PID-I in READY_DIR as
    they start), from when both workers are in a test, or with STARTING from when xdist
    is making its first worker's gateway (in its session start)."""
    tag = uuid.uuid4().hex
    ready = path / f"ready-{tag[:8]}"
    ready.mkdir()
    (path / f"test_slow_{tag[:8]}.py").write_text(source)
    (path / "conftest.py").write_text(CONTROLLER_MARKS)
    env = {**os.environ, TAG_ENV: tag, "READY_DIR": str(ready), "PYTHONUNBUFFERED": "1",
           **({"SLOW_START": "1"} if starting else {})}
    argv = [sys.executable, "-m", "pytest", f"test_slow_{tag[:8]}.py", "-n", "2",
            "-p", "no:cacheprovider", f"--basetemp={path / ('bt-' + tag[:8])}", *args]
    log = path / f"inner-{tag[:8]}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    inner = Inner(proc, tag, ready, log)
    try:
        if starting:  # xdist's session start is making the first gateway
            assert wait_for(lambda: _marks(ready, "gateway") == 1
                            and "created: 2/2 workers" in inner.text(), 120), inner.text()
        else:  # both workers inside a test, and their setup reports taken by the controller
            assert wait_for(lambda: _marks(ready, "controller-") >= 2 and _in_tests(ready) >= 2,
                            120), inner.text()[-3000:]
        yield inner
    finally:
        for p in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@dataclass
class Signalled:
    """One inner run signalled and ended: its exit status, log, report and workers."""

    returncode: int
    text: str
    report: Path
    workers_before: list[Proc]
    workers_gone: bool
    workers_left: list[Proc]
    interrupts: list[str]  # what interrupted each worker's test
    worker_pids: set[int]
    sent: list[tuple[int, int]]  # (pid, signal) the controller sent


def signal_controller(path: Path, sig: signal.Signals, *args: str,
                      source: str = SLEEPING) -> Signalled:
    with inner_xdist(path, *args, source=source) as inner:
        workers = inner.others()
        os.kill(inner.proc.pid, sig)
        inner.proc.wait(timeout=60)
        gone = wait_for(lambda: not inner.others(), GONE_LIMIT_S)
        interrupts = [p.read_text() for p in inner.ready.glob("interrupt-*")]
        pids = {int(p.name.split("-")[1]) for p in inner.ready.glob("pid-*")}
        sent_file = inner.ready / "sent"
        sent = [(int(a), int(b)) for a, b in (line.split() for line in
                                             sent_file.read_text().splitlines())
                ] if sent_file.exists() else []
        return Signalled(inner.proc.returncode, inner.text(), path / "t.json", workers, gone,
                         inner.others(), interrupts, pids, sent)


@pytest.fixture(scope="module")
def sigterm_with_report(tmp_path_factory: pytest.TempPathFactory,
                        pytestconfig: pytest.Config) -> Signalled:
    """The SIGTERM run with --sharedkv-json, once for the tests that read it (set up before
    the autouse isolation, so it isolates its own environment)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        isolate(monkeypatch, pytestconfig, tmp_path_factory)
        return signal_controller(tmp_path_factory.mktemp("sigterm"), signal.SIGTERM,
                                 "--sharedkv-json=t.json")


def test_sigterm_to_the_controller_keeps_the_report(sigterm_with_report: Signalled) -> None:
    """The controller collects nothing under xdist, yet SIGTERM must end it as Ctrl-C does:
    the JSON report is written, incomplete, naming SIGTERM, and the summary says so."""
    run = sigterm_with_report
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.text[-3000:]
    assert run.report.exists(), run.text[-3000:]
    data = json.loads(run.report.read_text())
    assert data["complete"] is False
    assert "SIGTERM" in data["interrupted"]
    assert "INTERRUPTED (KeyboardInterrupt: SIGTERM" in run.text


def test_no_worker_outlives_the_controller_terminated(sigterm_with_report: Signalled) -> None:
    _no_worker_outlives(sigterm_with_report)


def test_a_terminated_controller_passes_sigterm_on_to_its_workers(
        sigterm_with_report: Signalled) -> None:
    """The controller passes SIGTERM on, so each worker's test is interrupted by it at once
    and not by execnet's shutdown (which waits for the test, then interrupts it with
    SIGINT); how long each takes is benchmarks/signals.py's to say."""
    run = sigterm_with_report
    assert len(run.interrupts) >= 2, run.text[-2000:]
    assert set(run.interrupts) == {"SIGTERM: tearing down as for Ctrl-C"}, run.interrupts


def test_sigterm_while_xdist_starts_its_workers_keeps_the_report(
        pytester: pytest.Pytester) -> None:
    """xdist prints 'created: 2/2 workers' and goes on making them in its session start,
    which pytest does not finish for an interrupted start: the run still ends as for Ctrl-C,
    with its report (incomplete, naming SIGTERM), the line that says where, and nothing of
    it left running."""
    with inner_xdist(pytester.path, "--sharedkv-json=t.json", starting=True) as inner:
        os.kill(inner.proc.pid, signal.SIGTERM)
        inner.proc.wait(timeout=60)
        text = inner.text()
        assert inner.proc.returncode == pytest.ExitCode.INTERRUPTED, text[-3000:]
        report = pytester.path / "t.json"
        assert report.exists(), text[-3000:]
        data = json.loads(report.read_text())
        assert data["complete"] is False and "SIGTERM" in data["interrupted"]
        assert data["tests"] == []
        assert f"JSON report: {report}" in text
        assert wait_for(lambda: not inner.others(), GONE_LIMIT_S), inner.others()


def test_sigint_to_the_controller_alone_reaches_its_workers(pytester: pytest.Pytester) -> None:
    """A SIGINT sent to the controller's pid (a terminal's Ctrl-C goes to the whole group)
    is passed on to each worker at once, as SIGTERM is, instead of leaving them to
    execnet's shutdown; the report is written and no worker outlives the controller."""
    run = signal_controller(pytester.path, signal.SIGINT, "--sharedkv-json=t.json")
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.text[-3000:]
    assert len(run.worker_pids) == 2, run.worker_pids
    assert {pid for pid, sig in run.sent if sig == signal.SIGINT} == run.worker_pids, run.sent
    assert json.loads(run.report.read_text())["complete"] is False
    _no_worker_outlives(run)


def test_sigterm_reaches_a_controller_activated_by_reports(pytester: pytest.Pytester) -> None:
    """No --sharedkv-* option: the controller learns of sharedkv items from the workers'
    reports, and from then on SIGTERM is the Ctrl-C teardown there too."""
    run = signal_controller(pytester.path, signal.SIGTERM)
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.text[-3000:]
    assert "INTERRUPTED (KeyboardInterrupt: SIGTERM" in run.text


def _no_worker_outlives(run: Signalled) -> None:
    assert len(run.workers_before) >= 2, run.workers_before
    assert run.workers_gone, f"{len(run.workers_left)} worker(s) outlived the controller by " \
                             f"{GONE_LIMIT_S:g} s: {run.workers_left}\n{run.text[-2000:]}"


def test_no_worker_outlives_the_controller_killed(pytester: pytest.Pytester) -> None:
    _no_worker_outlives(signal_controller(pytester.path, signal.SIGKILL,
                                          "--sharedkv-json=t.json"))


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
