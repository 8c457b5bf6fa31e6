"""How the suite starts a process, so that nothing it starts outlives the run.

Every launch (replica servers, the LMCache server, transfer replicas, pinned-pool children)
goes through :func:`spawn`:

* the command runs under the supervisor (``supervise.py``): in its own session, with a
  parent-death signal and a watchdog that kills its whole process group when the owning
  pytest process (or, in an xdist worker, the controller) dies, however it died;
* it is forked from one long-lived thread: the parent-death signal fires when the *thread*
  that forked dies, and a fixture may run on a short-lived one;
* it carries a launch id in its environment, inherited by all its children (the proof a
  later run needs before it kills anything), and is recorded in the machine's runtime
  directory until it is stopped (``reaper.py``); the first launch of a process
  reaps what earlier runs that were killed hard left behind.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.host.leases import DEVICE_ORDER
from pytest_sharedkv.host.runtime_dir import RuntimeDirError
from pytest_sharedkv.processes import reaper
from pytest_sharedkv.processes.supervise import start_time

SUPERVISE = Path(__file__).with_name("supervise.py")
# Per process (a forked child has no spawner thread and must reap again), made on demand.
_SPAWNER: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_REAPED: set[int] = set()


def run_root() -> tuple[int, int | None] | None:
    """The xdist controller (this worker's parent), whose death must also stop launches."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    parent = os.getppid()
    return parent, start_time(parent)


def supervised(argv: Sequence[str]) -> list[str]:
    """ARGV under the supervisor, owned by this process (and the run's root, if any)."""
    command = [sys.executable, "-I", str(SUPERVISE), "--owner", str(os.getpid())]
    root = run_root()
    if root is not None:
        command += ["--root", f"{root[0]}:{root[1] if root[1] is not None else ''}"]
    return [*command, "--", *argv]


@dataclass
class Launch:
    """A started process group: the Popen of its leader and the record to drop at stop."""

    proc: subprocess.Popen[Any]
    launch_id: str
    record: Path | None

    def forget(self) -> None:
        if self.record is not None:
            reaper.forget(self.record)
            self.record = None


def _spawner() -> concurrent.futures.ThreadPoolExecutor:
    pid = os.getpid()
    if pid not in _SPAWNER:
        _SPAWNER[pid] = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sharedkv-spawner")
    return _SPAWNER[pid]


def reap_once() -> None:
    """Reap earlier runs' leftovers, once per process; say what was stopped."""
    if os.getpid() in _REAPED:
        return
    _REAPED.add(os.getpid())
    try:
        lines = reaper.reap()
    except (OSError, RuntimeDirError):
        return  # no shared directory: nothing recorded there to reap
    for line in lines:
        warnings.warn(f"sharedkv: {line}", reaper.LeftoverProcessesWarning,
                      stacklevel=3)


def spawn(argv: Sequence[str], env: Mapping[str, str] | None = None, **popen: Any) -> Launch:
    """Start ARGV supervised (own session; Popen keyword arguments pass through)."""
    reap_once()
    launch_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    full_env = {**(os.environ if env is None else env), **DEVICE_ORDER,
                reaper.LAUNCH_ID_ENV: launch_id}
    command = supervised(argv)

    def start() -> subprocess.Popen[Any]:
        return subprocess.Popen(command, env=full_env, start_new_session=True, **popen)

    proc = _spawner().submit(start).result()
    try:
        record: Path | None = reaper.record(launch_id, proc.pid, argv)
    except (OSError, RuntimeDirError):
        record = None  # the supervisor still watches it; only the next run's reaping is lost
    return Launch(proc, launch_id, record)
