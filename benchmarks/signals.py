"""How a sharedkv run under xdist ends when a signal or a closed stdout ends it.

Runs an inner ``pytest -n 2 --sharedkv-json`` of sleeping sharedkv tests in its own session
and ends it: SIGTERM or SIGINT, to the controller's pid or to its process group, at two
moments: ``start-up`` (right after xdist prints ``created: 2/2 workers``, before any test
report) and ``in-test`` (both workers inside a test). Then ``python -m pytest_sharedkv``
piped into a reader that closes after a line (``head -1``), for ``--help`` and for a run.
For each case it prints the exit status, the seconds to exit, whether the JSON report was
written and its ``JSON report:`` line printed, the processes of the run still alive 3 s
after the controller exited, and whether a traceback reached the terminal.

    python benchmarks/signals.py [--repeat 1] [--delay 0.05]

Timing is this script's job, not a test's: the self-tests (tests/test_signals*.py,
tests/test_broken_pipe.py) hold the outcomes, which do not depend on load.
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
SLEEPING = """
import os, time
import pytest

@pytest.mark.ordering
@pytest.mark.parametrize("i", range(4))
def test_sleep(i):
    open(os.path.join(os.environ["READY_DIR"], f"{os.getpid()}-{i}"), "w").close()
    time.sleep(60)
"""


def tagged(tag: str) -> list[int]:
    """Live processes (zombies excluded) whose environment carries TAG."""
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
        except OSError:
            continue
        found.append(int(entry.name))
    return found


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
        time.sleep(3)
        left = tagged(tag)
        text = log.read_text(errors="replace")
        return {"rc": rc, "exit_s": round(took, 2), "report": (work / "r.json").exists(),
                "line": "JSON report:" in text, "survivors": len(left),
                "traceback": "Traceback" in text}
    finally:
        for pid in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


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
    with tempfile.TemporaryDirectory(prefix="sharedkv-signals-") as tmp:
        root = Path(tmp)
        print("signal   target moment   | rc  exit_s report line survivors traceback")
        for moment in ("start-up", "in-test"):
            for sig in (signal.SIGTERM, signal.SIGINT):
                for target in ("pid", "group"):
                    for _ in range(args.repeat):
                        r = signal_case(root, sig, target, moment, args.delay)
                        print(f"{sig.name:8} {target:6} {moment:8} | " + (
                            str(r["error"]) if "error" in r else
                            f"{r['rc']:<3} {r['exit_s']:<6} {r['report']!s:6} "
                            f"{r['line']!s:5} {r['survivors']:<9} {r['traceback']}"))
        for case in (["--help"], ["-m", "ordering", "-p", "no:cacheprovider"]):
            r = pipe_case(root, case)
            print(f"| head -1: {' '.join(case)}: rc {r['rc']}, {r['exit_s']} s, report "
                  f"{r['report']}, traceback {r['traceback']}, stderr {r['stderr']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
