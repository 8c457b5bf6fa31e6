"""A size-capped tmpfs that no signal can leave mounted: it lives in a private mount
namespace of its own, held by one supervised process, and only the processes launched into
that namespace see it.

    python -I mount_ns.py hold --dir DIR --size BYTES --status FILE
    python -I mount_ns.py enter --pid HOLDER -- ARGV...

``hold`` unshares its mount namespace (mounts made private, so nothing propagates back to
the host's), mounts the tmpfs on DIR, writes FILE (``{"ready": true}`` or the refused step
and its errno) and waits; SIGTERM unmounts it and exits. ``enter`` joins the holder's
namespace and execs ARGV (same pid: the supervisor's wrapper, signals and log tails see the
real process). The suite reads the filesystem through ``/proc/HOLDER/root/DIR``.

A mount namespace is freed by the kernel once no process is in it, and with it the tmpfs:
the holder and everything entered are launched supervised (``spawn.py``), so they die with
the run however it dies (SIGKILL included), and the mount with them. The host's mount table
never holds it at all. :meth:`CappedTmpfs.stop` proves the namespace gone (no process under
``/proc`` is in it).

Mounting needs CAP_SYS_ADMIN (root, or a container that grants it): without it the holder
reports EPERM, and :class:`MountRefused` names the step and the errno. Standard library
only at the top, and run with ``-I`` (like ``supervise.py``). Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import errno as errno_module
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_sharedkv.processes.managed import ManagedProcess

CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
READY_TIMEOUT_S = 30.0
THIS = Path(__file__)


class MountRefused(RuntimeError):
    """The kernel refused a step of making the tmpfs (EPERM: no CAP_SYS_ADMIN here)."""

    def __init__(self, step: str, errno: int, message: str) -> None:
        super().__init__(message)
        self.step, self.errno = step, errno


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _write_status(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def hold(directory: Path, size: int, status: Path) -> int:
    libc = _libc()
    steps: tuple[tuple[str, Callable[[], int]], ...] = (
             ("unshare(CLONE_NEWNS)", lambda: libc.unshare(CLONE_NEWNS)),
             ("mount --make-rprivate /",
              lambda: libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)),
             (f"mount -t tmpfs -o size={size} tmpfs {directory}",
              lambda: libc.mount(b"tmpfs", str(directory).encode(), b"tmpfs", 0,
                                 f"size={size},mode=0755".encode())))
    for step, call in steps:
        if call() != 0:
            code = ctypes.get_errno()
            _write_status(status, {"ready": False, "step": step, "errno": code,
                                   "errno_name": errno_module.errorcode.get(code, str(code)),
                                   "strerror": os.strerror(code)})
            return 3
    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    _write_status(status, {"ready": True, "pid": os.getpid()})
    while not stop:
        signal.pause()
    libc.umount2(str(directory).encode(), MNT_DETACH)  # the namespace's end would anyway
    return 0


def enter(pid: int, argv: Sequence[str]) -> None:
    cwd = os.getcwd()
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    if _libc().setns(fd, CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        print(f"mount_ns enter: setns into pid {pid}'s mount namespace: "
              f"{os.strerror(code)}", file=sys.stderr, flush=True)
        raise SystemExit(3)
    os.close(fd)
    os.chdir(cwd)  # setns moved it to the namespace's root
    os.execvp(argv[0], list(argv))


def namespace_of(pid: int) -> str | None:
    """PID's mount namespace (``mnt:[INODE]``); None where it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def processes_in(namespace: str) -> list[int]:
    """Every process under /proc whose mount namespace is NAMESPACE."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "mnt") == namespace:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


class CappedTmpfs:
    """A tmpfs of SIZE bytes on WORKDIR/capped, seen only by the processes launched
    through :meth:`enter`: start, launch them, read it through :attr:`view`, stop them,
    then stop this (which proves nothing is left in its namespace)."""

    def __init__(self, workdir: Path, size: int, wrap: Sequence[str] = ()) -> None:
        self.mountpoint = workdir / "capped"
        self.size = size
        self.status = workdir / "capped-mount.json"
        self.wrap = list(wrap)  # a prefix for the holder (the self-tests drop a capability)
        self.holder: ManagedProcess | None = None
        self.namespace: str | None = None

    @property
    def pid(self) -> int:
        assert self.holder is not None
        return self.holder.pid

    @property
    def view(self) -> Path:
        """The mountpoint as this process reaches it: through the holder's root."""
        return Path(f"/proc/{self.pid}/root") / self.mountpoint.relative_to("/")

    def start(self) -> None:
        """Mounted and held; MountRefused names the refused step, ProcessFailed a holder
        that died or never answered."""
        from pytest_sharedkv.processes.managed import ManagedProcess

        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.status.unlink(missing_ok=True)
        self.holder = ManagedProcess(f"tmpfs holder ({self.size} bytes)", [
            *self.wrap, sys.executable, "-I", str(THIS), "hold", "--dir",
            str(self.mountpoint), "--size", str(self.size), "--status", str(self.status)],
            self.mountpoint.with_name("capped-mount.log"))
        self.holder.start()
        started = time.monotonic()
        while not self.status.exists():
            if not self.holder.alive() and not self.status.exists():
                raise self.holder.failure("exited before it mounted the tmpfs")
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise self.holder.failure(f"did not mount within {READY_TIMEOUT_S:g}s")
            time.sleep(0.01)
        status = json.loads(self.status.read_text())
        if not status.get("ready"):
            self.holder.stop()
            raise MountRefused(status["step"], int(status["errno"]), (
                f"a size-capped tmpfs cannot be mounted here: {status['step']} failed with "
                f"{status['errno_name']} ({status['strerror']})" + (
                    ": it needs CAP_SYS_ADMIN (root, or a container granted it)"
                    if status["errno"] == errno_module.EPERM else "")))
        self.namespace = namespace_of(self.pid)

    def enter(self, argv: Sequence[str] = ()) -> list[str]:
        """The prefix (with ARGV) that runs a command inside the tmpfs's namespace."""
        return [sys.executable, "-I", str(THIS), "enter", "--pid", str(self.pid), "--",
                *argv]

    def free_bytes(self) -> int | None:
        """What the tmpfs has left (statvfs through the holder); None where unreadable."""
        try:
            stat = os.statvfs(self.view)
        except OSError:
            return None
        return stat.f_bavail * stat.f_frsize

    def stop(self) -> list[int]:
        """Stop the holder (which unmounts); returns the processes still in the
        namespace (the mount lives while any does): none, once all entered are stopped."""
        if self.holder is None:
            return []
        survivors = self.holder.stop()
        if self.namespace is not None:
            deadline = time.monotonic() + 5.0
            while (left := processes_in(self.namespace)) and time.monotonic() < deadline:
                time.sleep(0.05)
            return sorted(set(survivors) | set(left))
        return survivors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    held = sub.add_parser("hold")
    held.add_argument("--dir", type=Path, required=True)
    held.add_argument("--size", type=int, required=True)
    held.add_argument("--status", type=Path, required=True)
    entered = sub.add_parser("enter")
    entered.add_argument("--pid", type=int, required=True)
    entered.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.role == "hold":
        return hold(args.dir, args.size, args.status)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    enter(args.pid, command)
    return 0  # not reached: exec


if __name__ == "__main__":
    raise SystemExit(main())
