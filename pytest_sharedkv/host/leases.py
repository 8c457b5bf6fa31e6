"""GPU leases: exclusive device ownership across xdist workers and runs, through file locks.

Each device has a lock file in one directory per machine and user (``runtime_dir.py``), so
xdist workers and concurrent runs alike never share a device; it is named by the device's
UUID where nvidia-smi gave one. A test takes all the devices it needs at once or none (no
hold-and-wait, so two workers that each need two devices cannot deadlock). The locks are
``flock`` locks: the kernel drops them when a process dies, so a crashed worker's lock file
never blocks the next test or the next run.

A lease lives as long as what uses the devices: a test's for the test, and ``share`` gives
what outlives it (a session's replica pair, whose engines hold the GPU) a lease of its own.
Within one process the leases of one device share one lock (an ``flock`` is per open file,
so a second lock would wait on the first forever): exclusion is between processes, and the
holder file lists every holder in the process that holds it.

Device indices are nvidia-smi's, which counts in PCI bus order; CUDA counts fastest first
unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so a lease's ``env()`` sets that beside
``CUDA_VISIBLE_DEVICES``. ``bind`` puts it in ``os.environ`` for one test only (in-process
CUDA and what the test starts), and ``unbind`` restores it. A process can only use the
devices that were visible when it first touched CUDA, so a process whose CUDA started under
a lease stays *bound* to its devices: later leases there include (or lie within) them.
"""

from __future__ import annotations

import itertools
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
_serial = itertools.count(1)


class LeaseTimeout(RuntimeError):
    """No set of free devices came up in time; the message names the holders."""


@dataclass(frozen=True)
class Lease:
    gpus: tuple[Gpu, ...]
    holder: str  # the line its devices' holder files show for it
    serial: int = field(default_factory=lambda: next(_serial), repr=False)

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(g.token for g in self.gpus)

    @property
    def visible_devices(self) -> str:
        """The CUDA_VISIBLE_DEVICES value for a process (or subprocess) using this lease."""
        return ",".join(self.tokens)

    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.visible_devices, **DEVICE_ORDER}


@dataclass(frozen=True)
class Binding:
    """What ``bind`` changed in os.environ, for ``unbind`` to put back."""

    lease: Lease
    before: tuple[tuple[str, str | None], ...]
    cuda_started: bool  # CUDA had started here before the lease was bound


@dataclass
class _Held:
    """One device this process holds: its lock, once, and the leases that hold it."""

    lock: FileLock
    leases: dict[int, str] = field(default_factory=dict)  # serial -> holder line


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
        self._held: dict[str, _Held] = {}  # lock key -> the device's lock and leases here
        lock_dir.mkdir(parents=True, exist_ok=True)

    def _lock_path(self, gpu: Gpu) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu.lock_key)
        return self.lock_dir / f"gpu-{safe}.lock"

    def _holder_path(self, gpu: Gpu) -> Path:
        return self._lock_path(gpu).with_suffix(".holder")

    def _candidates(self, count: int) -> list[tuple[Gpu, ...]]:
        """Device sets to try: the bound devices first (a process cannot switch devices),
        then those this process holds already (its pair's engines are on them)."""
        if self.bound is None:
            sets = list(combinations(self.gpus, count))
        else:
            bound = [g for g in self.gpus if g.token in self.bound]
            others = [g for g in self.gpus if g.token not in self.bound]
            if count <= len(bound):
                sets = list(combinations(bound, count))
            else:
                sets = [tuple(bound) + extra
                        for extra in combinations(others, count - len(bound))]
        return sorted(sets, key=lambda s: -sum(g.lock_key in self._held for g in s))

    def _try(self, gpus: tuple[Gpu, ...], what: str) -> Lease | None:
        taken: list[tuple[Gpu, FileLock]] = []
        for gpu in gpus:
            if gpu.lock_key in self._held:  # this process holds it: no second lock
                continue
            lock = FileLock(str(self._lock_path(gpu)))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                for _, held in reversed(taken):
                    held.release()
                return None
            taken.append((gpu, lock))
        for gpu, lock in taken:
            self._held[gpu.lock_key] = _Held(lock)
        return self._hold(gpus, what)

    def _hold(self, gpus: tuple[Gpu, ...], what: str) -> Lease:
        lease = Lease(gpus=gpus, holder=f"{self.owner} pid={os.getpid()} {what}".rstrip())
        for gpu in gpus:
            self._held[gpu.lock_key].leases[lease.serial] = lease.holder
            self._write_holder(gpu)
        return lease

    def _write_holder(self, gpu: Gpu) -> None:
        lines = self._held[gpu.lock_key].leases.values()
        self._holder_path(gpu).write_text("".join(f"{line}\n" for line in lines))

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

    def share(self, lease: Lease, what: str) -> Lease:
        """A lease of LEASE's devices for WHAT, which outlives LEASE's holder (a session's
        replica pair started by a test): the devices stay locked until both are released."""
        if not self.holds(lease):
            raise ValueError(f"cannot share a lease that was released: {lease.holder}")
        return self._hold(lease.gpus, what)

    def holds(self, lease: Lease) -> bool:
        return all(g.lock_key in self._held and lease.serial in self._held[g.lock_key].leases
                   for g in lease.gpus)

    def bind(self, lease: Lease) -> Binding:
        """Point this process at LEASE's devices for as long as its test runs: in-process
        CUDA, if it starts now, and every process the test starts see only them."""
        env = lease.env()
        binding = Binding(lease, tuple((k, os.environ.get(k)) for k in env),
                          cuda_initialized())
        os.environ.update(env)
        return binding

    def unbind(self, binding: Binding) -> None:
        """Restore the environment BINDING changed; where CUDA started under it, this
        process stays bound to its devices."""
        for key, value in binding.before:
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self.bound is None and not binding.cuda_started and cuda_initialized():
            self.bound = binding.lease.tokens

    def release(self, lease: Lease) -> None:
        for gpu in lease.gpus:
            held = self._held.get(gpu.lock_key)
            if held is None or held.leases.pop(lease.serial, None) is None:
                continue
            if held.leases:
                self._write_holder(gpu)
                continue
            self._holder_path(gpu).unlink(missing_ok=True)
            held.lock.release()
            del self._held[gpu.lock_key]

    def holders(self) -> str:
        parts = []
        for gpu in self.gpus:
            try:
                text = ", ".join(self._holder_path(gpu).read_text().split("\n")).strip(", ")
            except OSError:
                text = ""
            parts.append(f"{gpu.token}: {text or 'free'}")
        return "; ".join(parts)

