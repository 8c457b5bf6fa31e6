"""A host-memory budget shared by every xdist worker of a run, through a file lock.

N workers must never try to pin N full pools at once: each pool reserves its predicted
size in a ledger (a JSON file beside the GPU leases) before its child starts, and a pool
that cannot fit waits briefly, then is skipped with the numbers.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

LEDGER = "sharedkv-host-budget.json"
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
    key: str
    nbytes: int

    def release(self) -> None:
        self.ledger.release(self.key)


class HostBudget:
    def __init__(self, directory: Path, budget: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / LEDGER
        self.lock = FileLock(str(self.path) + ".lock")
        self.budget = budget

    def _read(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        # entries of processes that are gone no longer hold memory
        return {k: v for k, v in data.items() if _alive(k)}

    def held(self) -> int:
        with self.lock:
            return sum(self._read().values())

    def reserve(self, nbytes: int, what: str, wait_s: float = 0.0) -> Reservation | str:
        """A reservation, or the reason it cannot fit (with the numbers)."""
        key = f"{os.getpid()}:{what}"
        deadline = time.monotonic() + wait_s
        while True:
            with self.lock:
                entries = self._read()
                held = sum(entries.values())
                if nbytes > self.budget:
                    return (f"{what} needs {_gib(nbytes)} of pinned host memory; the host budget "
                            f"is {_gib(self.budget)}")
                if held + nbytes <= self.budget:
                    entries[key] = nbytes
                    self.path.write_text(json.dumps(entries))
                    return Reservation(self, key, nbytes)
            if time.monotonic() >= deadline:
                return (f"{what} needs {_gib(nbytes)}; other workers hold {_gib(held)} of a "
                        f"{_gib(self.budget)} host budget")
            time.sleep(POLL_S)

    def release(self, key: str) -> None:
        with self.lock:
            entries = self._read()
            entries.pop(key, None)
            self.path.write_text(json.dumps(entries))


def _alive(key: str) -> bool:
    try:
        os.kill(int(key.split(":", 1)[0]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"
