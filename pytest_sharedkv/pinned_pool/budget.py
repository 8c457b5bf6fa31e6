"""A host-memory budget shared by every xdist worker and every run on the machine.

N workers must never try to pin N full pools at once: each pool reserves its predicted
size before its child starts, and a pool that cannot fit waits briefly, then is skipped
with the numbers. A reservation is a file its holder keeps ``flock``-ed (the pattern of the
GPU leases): it is live exactly while the lock is held, so the kernel ends it when the
holder dies, and a PID that a crashed holder left behind and another process now has
means nothing. One ledger lock serialises reservations.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from filelock import FileLock

LEDGER_LOCK = "sharedkv-host-budget.lock"
SUFFIX = ".reservation"
POLL_S = 0.5


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_budget() -> int | None:
    """90% of what the kernel says is available now (override with --sharedkv-host-budget-gib:
    some VMs grow their memory on use and report too little at first)."""
    available = mem_available()
    return None if available is None else int(available * 0.9)


@dataclass
class Reservation:
    ledger: HostBudget
    path: Path
    nbytes: int
    handle: IO[str]

    def release(self) -> None:
        self.ledger.release(self)


def _held_by_someone(path: Path) -> int | None:
    """The bytes of a reservation whose holder still holds its lock, else None (and the
    stale file is removed)."""
    try:
        with path.open() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return int(json.loads(handle.read() or "{}").get("nbytes", 0))
            path.unlink(missing_ok=True)  # nobody holds it: its holder is gone
            return None
    except (OSError, ValueError):
        return None


class HostBudget:
    def __init__(self, directory: Path, budget: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.lock = FileLock(str(directory / LEDGER_LOCK))
        self.budget = budget

    def _held(self) -> int:
        return sum(n for p in sorted(self.directory.glob("*" + SUFFIX))
                   if (n := _held_by_someone(p)) is not None)

    def held(self) -> int:
        with self.lock:
            return self._held()

    def reserve(self, nbytes: int, what: str, wait_s: float = 0.0) -> Reservation | str:
        """A reservation, or the reason it cannot fit (with the numbers)."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.lock:
                held = self._held()
                if nbytes > self.budget:
                    return (f"{what} needs {_gib(nbytes)} of pinned host memory; the host budget "
                            f"is {_gib(self.budget)}")
                if held + nbytes <= self.budget:
                    return self._take(nbytes, what)
            if time.monotonic() >= deadline:
                return (f"{what} needs {_gib(nbytes)}; other workers hold {_gib(held)} of a "
                        f"{_gib(self.budget)} host budget")
            time.sleep(POLL_S)

    def _take(self, nbytes: int, what: str) -> Reservation:
        path = self.directory / f"{os.getpid()}-{uuid.uuid4().hex[:12]}{SUFFIX}"
        handle = path.open("x")
        fcntl.flock(handle, fcntl.LOCK_EX)  # before anyone can look: we hold the ledger lock
        handle.write(json.dumps({"pid": os.getpid(), "nbytes": nbytes, "what": what}))
        handle.flush()
        return Reservation(self, path, nbytes, handle)

    def release(self, reservation: Reservation) -> None:
        with self.lock:
            reservation.path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                reservation.handle.close()


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"
