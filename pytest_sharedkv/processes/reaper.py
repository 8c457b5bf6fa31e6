"""What each run launched, so that the next run can reap what a hard kill left behind.

One JSON file per launched process group in ``<runtime dir>/launched/``: the leader's pid
(= its process group), its start time (``/proc/PID/stat``), argv, the launch id, and the
owning pytest process's pid and start time. The file goes when the group is stopped.

The supervisor's parent-death signal and watchdog (``supervise.py``) normally leave nothing
to reap; this is the last line, for what they could not see (a watchdog killed with its
owner). A later run kills only what it can prove it started: the owner is gone (its pid no
longer names the process that started then), and every process it kills carries the
launch id in its environment (a group member inherits it; an unrelated process that reused
a pid or a process group id does not), the leader also its recorded start time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_sharedkv.host.runtime_dir import subdir
from pytest_sharedkv.processes.supervise import group_members, running, start_time

REGISTRY_DIR = "launched"
LAUNCH_ID_ENV = "SHAREDKV_LAUNCH_ID"
GRACE_S = 2.0


class LeftoverProcessesWarning(UserWarning):
    """Processes of an earlier run that was killed hard were found and stopped."""


def registry_dir() -> Path:
    return subdir(REGISTRY_DIR)


def record(launch_id: str, pid: int, argv: Sequence[str]) -> Path:
    """Note a launched group (its leader is PID); returns the record to forget at stop."""
    path = registry_dir() / f"{launch_id}.json"
    data = {"launch_id": launch_id, "pid": pid, "pgid": pid, "start_time": start_time(pid),
            "argv": list(argv), "owner_pid": os.getpid(), "owner_start": start_time(os.getpid()),
            "recorded_at": time.time()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
    return path


def forget(path: Path) -> None:
    path.unlink(missing_ok=True)


def carries(pid: int, launch_id: str) -> bool:
    """True when PID's environment holds this launch id (proof it descends from the launch)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{LAUNCH_ID_ENV}={launch_id}".encode() in environ.split(b"\0")


def proven_members(entry: dict[str, Any]) -> list[int]:
    """The recorded group's live processes that provably come from this launch."""
    launch_id, pid = str(entry["launch_id"]), int(entry["pid"])
    members = set(group_members(int(entry["pgid"])))
    if running(pid, entry.get("start_time")):
        members.add(pid)
    proven = []
    for member in sorted(members):
        if member == pid and not running(pid, entry.get("start_time")):
            continue  # a reused pid: not the leader we started
        if carries(member, launch_id):
            proven.append(member)
    return proven


def _stop(pids: list[int]) -> list[int]:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(running(p) for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if running(p)]
        if not pids:
            break
    return pids


def reap(directory: Path | None = None) -> list[str]:
    """Stop what earlier runs' dead owners left; returns one line per reaped group."""
    lines = []
    for path in sorted((directory or registry_dir()).glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            owner_alive = running(int(entry["owner_pid"]), entry.get("owner_start"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if owner_alive:
            continue
        proven = proven_members(entry)
        left = _stop(proven) if proven else []
        if proven:
            command = " ".join(str(a) for a in entry.get("argv", []))[:160]
            lines.append(f"stopped {len(proven) - len(left)} process(es) {proven} of a launch "
                         f"by pid {entry['owner_pid']}, which is gone: {command}")
        if not left:
            forget(path)
    return lines
