"""Nothing the suite launches outlives the run: SIGINT, SIGTERM or SIGKILL, sent to the pytest
process or to its process group, with and without xdist, for the stub pair (a test double)
and the transfer provider (the real LMCache server and two replica processes, on CPU).

The default cases are a pairwise covering design (6 per provider, every pair of factor
values at least once; a self-test below checks the cover). The full 12-case matrix per
provider runs with ``SHAREDKV_SELFTEST_FULL_SIGNALS=1`` in the environment.

Each case runs an inner pytest in its own session, waits until its processes are up, sends
the signal, and counts the launched processes still alive: the target is 0, within a limit
that only catches a process that never goes (how soon they go is benchmarks/signals.py's,
against its 10 s budget). The processes are found by a tag in their environment (every
launched process inherits the inner run's environment), so the count does not depend on
how the plugin tracks them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process_tags import TAG_ENV, Proc, tagged

DEADLINE_S = 60.0  # only a process that never goes fails; benchmarks/signals.py times it
LAUNCHED = ("stub_openai", "lmcache", "checks.transfer_provider", "supervise")

HOLD_STUB = """
import os, time
import pytest

@pytest.mark.replica_pair
@pytest.mark.parametrize("i", range(2))
def test_hold(sharedkv_replica_pair, i):
    open(os.path.join(os.environ["READY_DIR"], f"{os.getpid()}-{i}"), "w").close()
    time.sleep(600)
"""

HOLD_TRANSFER = """
import os
import pytest

@pytest.mark.replica_pair
def test_transfer(tmp_path):
    from pytest_sharedkv.stack.checks.transfer_provider import run_pair

    open(os.path.join(os.environ["READY_DIR"], str(os.getpid())), "w").close()
    run_pair(tmp_path, "signal-test")
"""


def is_launched(proc: Proc) -> bool:
    return any(word in proc.cmdline for word in LAUNCHED)


def launched(tag: str) -> list[Proc]:
    return [p for p in tagged(tag) if is_launched(p)]


def wait_for(predicate: object, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]


@contextlib.contextmanager
def inner_run(pytester: pytest.Pytester, code: str, xdist: bool, *args: str
              ) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """An inner pytest in its own session (so its group can be signalled), tagged."""
    tag = uuid.uuid4().hex
    ready = pytester.mkdir(f"ready-{tag[:8]}")
    pytester.makepyfile(**{f"test_hold_{tag[:8]}": code})
    env = {**os.environ, TAG_ENV: tag, "READY_DIR": str(ready)}
    argv = [sys.executable, "-m", "pytest", f"test_hold_{tag[:8]}.py", "-p", "no:cacheprovider",
            f"--basetemp={pytester.path / ('bt-' + tag[:8])}", *args]
    if xdist:
        argv += ["-n", "2"]
    log = (pytester.path / f"inner-{tag[:8]}.log").open("wb")
    proc = subprocess.Popen(argv, cwd=pytester.path, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, tag, ready
    finally:
        for p in tagged(tag):  # leave nothing behind, whatever the outcome
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()


def send(proc: subprocess.Popen[bytes], sig: signal.Signals, target: str) -> None:
    if target == "group":
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)


def survivors_after(proc: subprocess.Popen[bytes], tag: str, sig: signal.Signals,
                    target: str) -> list[Proc]:
    send(proc, sig, target)
    wait_for(lambda: not launched(tag), DEADLINE_S)
    return launched(tag)


def describe(procs: list[Proc], log: Path) -> str:
    lines = [f"{len(procs)} launched process(es) survived {DEADLINE_S:g}s:"]
    lines += [f"  {p.pid}: {p.cmdline[:200]}" for p in procs]
    lines.append("--- inner run ---")
    lines += log.read_text(errors="replace").splitlines()[-30:]
    return "\n".join(lines)


SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
TARGETS = ("pid", "group")
XDIST = (False, True)
FULL_MATRIX_ENV = "SHAREDKV_SELFTEST_FULL_SIGNALS"  # "1": every signal x target x xdist case
FULL = [(sig, target, xdist) for sig in SIGNALS for target in TARGETS for xdist in XDIST]
# A covering design: every pair of factor values (signal and target, signal and xdist,
# target and xdist) is in some case, so each provider still sees every signal, every
# target and both xdist modes; 6 cases, the fewest that hold 3 signals x 2 targets.
PAIRWISE = [(signal.SIGINT, "pid", False), (signal.SIGINT, "group", True),
            (signal.SIGTERM, "pid", True), (signal.SIGTERM, "group", False),
            (signal.SIGKILL, "pid", False), (signal.SIGKILL, "group", True)]


def _param(sig: signal.Signals, target: str, xdist: bool) -> object:
    return pytest.param(sig, target, xdist,
                        id=f"{sig.name}-{target}-{'xdist' if xdist else 'no-xdist'}")


CASES = [_param(*case) for case in (FULL if os.environ.get(FULL_MATRIX_ENV) == "1"
                                    else PAIRWISE)]


def uncovered_pairs(cases: list[tuple[signal.Signals, str, bool]]) -> list[str]:
    """The pairs of factor values no case holds (empty for a covering design)."""
    factors = (SIGNALS, TARGETS, XDIST)
    missing = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        for a in factors[i]:
            for b in factors[j]:
                if not any(case[i] == a and case[j] == b for case in cases):
                    missing.append(f"{getattr(a, 'name', a)}/{getattr(b, 'name', b)}")
    return missing


def test_the_default_cases_cover_every_pair_of_factor_values() -> None:
    """The pairwise design is only worth its cut if it holds every pair; the checker must
    see a pair a design drops."""
    assert uncovered_pairs(PAIRWISE) == []
    assert uncovered_pairs(FULL) == []
    assert uncovered_pairs(PAIRWISE[1:]) == ["SIGINT/pid", "SIGINT/False"]
    assert {case[0] for case in PAIRWISE} == set(SIGNALS)


@pytest.mark.parametrize(("sig", "target", "xdist"), CASES)
def test_stub_pair_leaves_nothing(pytester: pytest.Pytester, sig: signal.Signals, target: str,
                                  xdist: bool) -> None:
    holders = 2 if xdist else 1
    with inner_run(pytester, HOLD_STUB, xdist, "--sharedkv-provider=stub") as (proc, tag, ready):
        assert wait_for(lambda: len(list(ready.iterdir())) >= holders, 120), "never ready"
        assert len([p for p in launched(tag) if "stub_openai" in p.cmdline]) >= 2 * holders
        survivors = survivors_after(proc, tag, sig, target)
        assert survivors == [], describe(survivors, pytester.path / f"inner-{tag[:8]}.log")


@pytest.mark.parametrize(("sig", "target", "xdist"), CASES)
def test_transfer_provider_leaves_nothing(pytester: pytest.Pytester, sig: signal.Signals,
                                          target: str, xdist: bool) -> None:
    if importlib.util.find_spec("lmcache") is None:  # not imported here: only the runs need it
        pytest.skip("lmcache not installed")

    def replica_up() -> bool:  # the replicas start with the server; wait until it is ready
        return any("checks.transfer_provider" in p.cmdline for p in launched(tag)) and any(
            (pytester.path / f"bt-{tag[:8]}").rglob("server.ready"))

    with inner_run(pytester, HOLD_TRANSFER, xdist) as (proc, tag, _ready):
        assert wait_for(replica_up, 180), "the transfer replica or its server never started"
        survivors = survivors_after(proc, tag, sig, target)
        assert survivors == [], describe(survivors, pytester.path / f"inner-{tag[:8]}.log")
