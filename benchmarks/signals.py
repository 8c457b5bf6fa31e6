"""How a sharedkv run under xdist ends when a signal or a closed stdout ends it, and how
soon what it started is gone.

Runs an inner ``pytest -n 2 --sharedkv-json`` of sleeping sharedkv tests in its own session
and ends it: SIGTERM or SIGINT, to the controller's pid or to its process group, at two
moments: ``start-up`` (right after xdist prints ``created: 2/2 workers``, before any test
report) and ``in-test`` (both workers inside a test). Then ``python -m pytest_sharedkv``
piped into a reader that closes after a line (``head -1``), for ``--help`` and for a run.
For each case it prints the exit status, the seconds to exit, whether the JSON report was
written and its ``JSON report:`` line printed, the seconds until no process of the run was
left after the controller exited (budget: 3 s) and whether a traceback reached the terminal.
Then the stub pair (``--sharedkv-provider=stub``, with and without xdist) held by a test and
signalled (SIGINT, SIGTERM, SIGKILL, to the pid or the group): the seconds until none of the
processes it launched is left (budget: 10 s). The exit status is 1 where a case is over its
budget.

    python benchmarks/signals.py [--repeat 1] [--delay 0.05]

Timing is this script's job, not a test's: the self-tests (tests/test_signals*.py,
tests/test_closed_stdout.py) hold the outcomes, which do not depend on load, with limits
that only catch a process that never goes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

TAG_ENV = "SHAREDKV_BENCH_TAG"
ROOT = Path(__file__).resolve().parents[1]
WORKERS_GONE_BUDGET_S = 3.0  # after the controller exited
LAUNCHED_GONE_BUDGET_S = 10.0  # after the signal
GIVE_UP_S = 60.0
LAUNCHED = ("stub_openai", "supervise")
SLEEPING = """
import os, time
import pytest

@pytest.mark.ordering
@pytest.mark.parametrize("i", range(4))
def test_sleep(i):
    open(os.path.join(os.environ["READY_DIR"], f"{os.getpid()}-{i}"), "w").close()
    time.sleep(60)
"""
HOLD_STUB = """
import os, time
import pytest

@pytest.mark.replica_pair
@pytest.mark.parametrize("i", range(2))
def test_hold(sharedkv_replica_pair, i):
    open(os.path.join(os.environ["READY_DIR"], f"{os.getpid()}-{i}"), "w").close()
    time.sleep(600)
"""


def tagged(tag: str, words: tuple[str, ...] = ()) -> list[int]:
    """Live processes (zombies excluded) whose environment carries TAG (and whose command
    line holds one of WORDS, where given)."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if not words or any(word in cmdline for word in words):
            found.append(int(entry.name))
    return found


def gone_after(tag: str, words: tuple[str, ...] = ()) -> float | None:
    """Seconds until no process of TAG (of WORDS) is left; None: some outlived GIVE_UP_S."""
    started = time.monotonic()
    if wait_for(lambda: not tagged(tag, words), GIVE_UP_S):
        return time.monotonic() - started
    return None


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def signal_case(root: Path, sig: signal.Signals, target: str, moment: str, delay: float
                ) -> dict[str, object]:
    tag = uuid.uuid4().hex
    work = root / tag[:8]
    ready = work / "ready"
    ready.mkdir(parents=True)
    (work / "test_sleep.py").write_text(SLEEPING)
    log = work / "out.log"
    env = {**os.environ, TAG_ENV: tag, "READY_DIR": str(ready), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "pytest", "test_sleep.py", "-n", "2", "-p", "no:cacheprovider",
            "--sharedkv-json=r.json", f"--basetemp={work / 'bt'}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        if moment == "start-up":
            ok = wait_for(lambda: "created: 2/2 workers" in log.read_text(errors="replace"), 120)
            time.sleep(delay)
        else:
            ok = wait_for(lambda: len(list(ready.iterdir())) >= 2, 120)
        if not ok:
            return {"error": "never reached the moment"}
        sent = time.monotonic()
        if target == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        rc = proc.wait(timeout=120)
        took = time.monotonic() - sent
        gone = gone_after(tag)
        text = log.read_text(errors="replace")
        return {"rc": rc, "exit_s": round(took, 2), "report": (work / "r.json").exists(),
                "line": "JSON report:" in text, "gone_s": gone,
                "traceback": "Traceback" in text}
    finally:
        for pid in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def launched_case(root: Path, sig: signal.Signals, target: str, xdist: bool
                  ) -> float | str | None:
    """The stub pair held by a test, signalled: seconds until none of it is left."""
    tag = uuid.uuid4().hex
    work = root / tag[:8]
    ready = work / "ready"
    ready.mkdir(parents=True)
    (work / "test_hold.py").write_text(HOLD_STUB)
    env = {**os.environ, TAG_ENV: tag, "READY_DIR": str(ready)}
    argv = [sys.executable, "-m", "pytest", "test_hold.py", "-p", "no:cacheprovider",
            "--sharedkv-provider=stub", f"--basetemp={work / 'bt'}", *(
                ["-n", "2"] if xdist else [])]
    with (work / "out.log").open("wb") as out:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        holders = 2 if xdist else 1
        if not wait_for(lambda: len(list(ready.iterdir())) >= holders, 180):
            return "never held"
        if target == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        return gone_after(tag, LAUNCHED)
    finally:
        for pid in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _seconds(value: object) -> str:
    return "never" if value is None else f"{value:.2f}" if isinstance(value, float) \
        else str(value)


def pipe_case(root: Path, args: list[str]) -> dict[str, object]:
    """``python -m pytest_sharedkv ARGS | head -1``: the reader closes after one line."""
    work = root / uuid.uuid4().hex[:8]
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    writer = subprocess.Popen([sys.executable, "-m", "pytest_sharedkv", *args], cwd=work,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    writer.stdout.readline()
    writer.stdout.close()  # the reader is gone
    started = time.monotonic()
    err = writer.stderr.read().decode(errors="replace")
    rc = writer.wait(timeout=600)
    return {"rc": rc, "exit_s": round(time.monotonic() - started, 2),
            "report": (work / "sharedkv-report.json").exists(),
            "traceback": "Traceback" in err, "stderr": err.strip().splitlines()[:1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each signal case")
    parser.add_argument("--delay", type=float, default=0.05,
                        help="seconds after 'created: 2/2 workers' for the start-up moment")
    args = parser.parse_args(argv)
    over: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sharedkv-signals-") as tmp:
        root = Path(tmp)
        print(f"signal   target moment   | rc  exit_s report line gone_s (budget "
              f"{WORKERS_GONE_BUDGET_S:g}) traceback")
        for moment in ("start-up", "in-test"):
            for sig in (signal.SIGTERM, signal.SIGINT):
                for target in ("pid", "group"):
                    for _ in range(args.repeat):
                        r = signal_case(root, sig, target, moment, args.delay)
                        name = f"{sig.name:8} {target:6} {moment:8}"
                        gone = r.get("gone_s")
                        if "error" not in r and not (isinstance(gone, float)
                                                     and gone <= WORKERS_GONE_BUDGET_S):
                            over.append(name)
                        print(f"{name} | " + (
                            str(r["error"]) if "error" in r else
                            f"{r['rc']:<3} {r['exit_s']:<6} {r['report']!s:6} "
                            f"{r['line']!s:5} {_seconds(gone):<17} {r['traceback']}"))
        print(f"stub pair: signal target xdist | launched gone_s (budget "
              f"{LAUNCHED_GONE_BUDGET_S:g})")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            for target in ("pid", "group"):
                for xdist in (False, True):
                    for _ in range(args.repeat):
                        gone = launched_case(root, sig, target, xdist)
                        name = f"stub pair {sig.name} {target} {'xdist' if xdist else '-'}"
                        if not isinstance(gone, float) or gone > LAUNCHED_GONE_BUDGET_S:
                            over.append(name)
                        print(f"{name} | {_seconds(gone)}")
        for case in (["--help"], ["-m", "ordering", "-p", "no:cacheprovider"]):
            r = pipe_case(root, case)
            print(f"| head -1: {' '.join(case)}: rc {r['rc']}, {r['exit_s']} s, report "
                  f"{r['report']}, traceback {r['traceback']}, stderr {r['stderr']}")
    print(f"over budget: {'; '.join(over)}" if over else "every case within its budget")
    return 1 if over else 0

if __name__ == "__main__":
    sys.exit(main())
