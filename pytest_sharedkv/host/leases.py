"""GPU leases: exclusive device ownership per test, across xdist workers, through file locks.

Each device has a lock file in one directory per machine and user (``runtime_dir.py``), so
xdist workers and concurrent runs alike never share a device; it is named by the device's
UUID where nvidia-smi gave one. A test takes all the devices it needs at once or none (no
hold-and-wait, so two workers that each need two devices cannot deadlock). The locks are
``flock`` locks: the kernel drops them when a process dies, so a crashed worker's lock file
never blocks the next test or the next run.

Device indices are nvidia-smi's, which counts in PCI bus order; CUDA counts fastest first
unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so a lease sets that beside
``CUDA_VISIBLE_DEVICES`` (here and in what the suite launches).

A process can only use the devices that were in ``CUDA_VISIBLE_DEVICES`` when it first
touched CUDA, so the first lease in a process *binds* it: later leases in that process
always include (or lie within) the bound devices.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from filelock import FileLock, Timeout

from pytest_sharedkv.host.devices import Gpu

LEASE_DIR_NAME = "leases"  # under the runtime dir
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # indices mean what nvidia-smi says
POLL_S = 0.05


class LeaseTimeout(RuntimeError):
    """No set of free devices came up in time; the message names the holders."""


@dataclass
class Lease:
    gpus: tuple[Gpu, ...]
    locks: list[FileLock] = field(repr=False)

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(g.token for g in self.gpus)

    @property
    def visible_devices(self) -> str:
        """The CUDA_VISIBLE_DEVICES value for a process (or subprocess) using this lease."""
        return ",".join(self.tokens)

    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.visible_devices, **DEVICE_ORDER}


def cuda_initialized() -> bool:
    """True once torch has created a CUDA context here (changing the env is then too late)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        cuda = torch.cuda
        # A cached device count means the CUDA runtime already read CUDA_VISIBLE_DEVICES.
        counted = getattr(cuda, "_cached_device_count", None) is not None
        return bool(cuda.is_initialized()) or counted
    except Exception:
        return False


class LeaseManager:
    """Hands out device leases; one per process, lock files shared by the whole run."""

    def __init__(self, lock_dir: Path, gpus: Sequence[Gpu], owner: str) -> None:
        self.lock_dir = lock_dir
        self.gpus = tuple(gpus)
        self.owner = owner
        self.bound: tuple[str, ...] | None = None
        lock_dir.mkdir(parents=True, exist_ok=True)

    def _lock_path(self, gpu: Gpu) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu.lock_key)
        return self.lock_dir / f"gpu-{safe}.lock"

    def _holder_path(self, gpu: Gpu) -> Path:
        return self._lock_path(gpu).with_suffix(".holder")

    def _candidates(self, count: int) -> list[tuple[Gpu, ...]]:
        """Device sets to try, the bound devices first (a process cannot switch devices)."""
        if self.bound is None:
            return list(combinations(self.gpus, count))
        bound = [g for g in self.gpus if g.token in self.bound]
        others = [g for g in self.gpus if g.token not in self.bound]
        if count <= len(bound):
            return list(combinations(bound, count))
        return [tuple(bound) + extra for extra in combinations(others, count - len(bound))]

    def _try(self, gpus: tuple[Gpu, ...], what: str) -> Lease | None:
        taken: list[FileLock] = []
        for gpu in gpus:
            lock = FileLock(str(self._lock_path(gpu)))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                for held in reversed(taken):
                    held.release()
                return None
            taken.append(lock)
        for gpu in gpus:
            self._holder_path(gpu).write_text(f"{self.owner} pid={os.getpid()} {what}\n")
        return Lease(gpus=gpus, locks=taken)

    def acquire(self, count: int, timeout: float, what: str = "") -> Lease:
        if count > len(self.gpus):
            raise LeaseTimeout(f"needs {count} devices, {len(self.gpus)} can be leased")
        candidates = self._candidates(count)
        if not candidates:
            raise LeaseTimeout(
                f"this process is bound to devices {','.join(self.bound or ())} "
                f"(CUDA was initialised with them) and cannot take {count} device(s) with them"
            )
        deadline = time.monotonic() + timeout
        while True:
            for gpus in candidates:
                lease = self._try(gpus, what)
                if lease is not None:
                    return lease
            if time.monotonic() >= deadline:
                raise LeaseTimeout(
                    f"no {count} free device(s) within {timeout:g}s; holders: {self.holders()}"
                )
            time.sleep(POLL_S)

    def bind(self, lease: Lease) -> None:
        """Point this process at the leased devices, if CUDA has not started here yet."""
        if self.bound is None and not cuda_initialized():
            os.environ.update(lease.env())
            self.bound = lease.tokens

    def release(self, lease: Lease) -> None:
        for gpu in lease.gpus:
            self._holder_path(gpu).unlink(missing_ok=True)
        for lock in reversed(lease.locks):
            lock.release()
        lease.locks.clear()

    def holders(self) -> str:
        parts = []
        for gpu in self.gpus:
            try:
                text = self._holder_path(gpu).read_text().strip()
            except OSError:
                text = "free"
            parts.append(f"{gpu.token}: {text}")
        return "; ".join(parts)
