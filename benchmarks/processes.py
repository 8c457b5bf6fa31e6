"""How quickly the plugin's process handling acts, each figure against its budget.

* lease: a device whose holder was SIGKILLed is leased again (from the holder reaped to the
  lease; the kernel drops a dead process's flock);
* ready: a stub replica serves /health (from start to the first 200);
* stop: ``ManagedProcess.stop(grace=1)`` of a group whose leader ignores SIGTERM (SIGKILL
  after the grace);
* abort: ``wait_ready`` of a replica ends once its peer logs a fatal error (the LMCache
  server's failed engine registration), within a 60 s limit it never reaches.

Each runs ``--repeat`` times; the median and the worst are printed against the budget, and
the exit status is 1 where a worst case is over it.

    python benchmarks/processes.py [--repeat 5]

Timing is this script's job, not a test's: the self-tests (tests/test_leases.py,
tests/test_launcher.py) hold the outcomes (the lease taken at the first try, the leader
killed by SIGKILL, the wait ended at its first look), which do not depend on load.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

BUDGET_S = {"lease": 1.0, "ready": 30.0, "stop": 10.0, "abort": 5.0}
IGNORES_SIGTERM = ("import signal, subprocess, sys, time\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                   "print('up', flush=True)\n"
                   "time.sleep(600)\n")
FATAL = ("RuntimeError: Device UUID 149562a8 not found in the discovered devices. Please "
         "make sure the process can see all the accelerator devices\n")


def lease(work: Path) -> float:
    from pytest_sharedkv.host.devices import Gpu
    from pytest_sharedkv.host.leases import LeaseManager

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from pytest_sharedkv.host.devices import Gpu
        from pytest_sharedkv.host.leases import LeaseManager
        LeaseManager(Path({str(work)!r}), [Gpu("0", "fake")], owner="doomed").acquire(1, 5)
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    manager = LeaseManager(work, [Gpu("0", "fake")], owner="next")
    holder.kill()
    holder.wait()
    started = time.monotonic()
    manager.release(manager.acquire(1, timeout=30))
    return time.monotonic() - started


def ready(work: Path) -> float:
    from pytest_sharedkv.processes.managed import ManagedProcess, free_port, http_ok

    port = free_port()
    proc = ManagedProcess("stub replica A", [sys.executable, "-m",
                                             "pytest_sharedkv.stack.stub.stub_openai", "--port",
                                             str(port), "--name", "A"], work / "a.log")
    proc.start()
    try:
        return proc.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 300,
                               "serving /health", interval=0.02)
    finally:
        proc.stop()


def stop(work: Path) -> float:
    from pytest_sharedkv.processes.managed import ManagedProcess, group_members
    from pytest_sharedkv.processes.supervise import is_watchdog

    proc = ManagedProcess("stubborn", [sys.executable, "-c", IGNORES_SIGTERM], work / "s.log")
    proc.start()
    proc.wait_ready(lambda: "up" in proc.log_text() and len(
        [p for p in group_members(proc.pid) if not is_watchdog(p)]) == 2, 300,
        "up with its child", interval=0.02)
    started = time.monotonic()
    left = proc.stop(grace=1.0)
    if left:
        raise SystemExit(f"stop left {left} running")
    return time.monotonic() - started


def abort(work: Path) -> float:
    from pytest_sharedkv.processes.managed import ManagedProcess, ProcessFailed

    proc = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                          work / "sleeper.log")
    proc.start()
    try:
        started = time.monotonic()
        try:
            proc.wait_ready(lambda: False, 60, "serving /health", abort=lambda: FATAL)
        except ProcessFailed:
            return time.monotonic() - started
        raise SystemExit("wait_ready ended without the peer's reason")
    finally:
        proc.stop()


CASES: dict[str, Callable[[Path], float]] = {"lease": lease, "ready": ready, "stop": stop,
                                              "abort": abort}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each case")
    args = parser.parse_args(argv)
    over = []
    with tempfile.TemporaryDirectory(prefix="sharedkv-processes-") as tmp:
        os.environ["SHAREDKV_RUNTIME_DIR"] = str(Path(tmp) / "runtime")
        print(f"case  | median s | worst s | budget s ({args.repeat} runs each)")
        for name, case in CASES.items():
            seconds = []
            for i in range(args.repeat):
                work = Path(tmp) / f"{name}-{i}"
                work.mkdir()
                seconds.append(case(work))
            worst = max(seconds)
            verdict = "within" if worst <= BUDGET_S[name] else "OVER"
            if verdict == "OVER":
                over.append(name)
            print(f"{name:5} | {statistics.median(seconds):8.3f} | {worst:7.3f} | "
                  f"{BUDGET_S[name]:g} ({verdict})")
    print(f"over budget: {', '.join(over)}" if over else "every case within its budget")
    return 1 if over else 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
