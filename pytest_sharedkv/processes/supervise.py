"""The exec wrapper every launched process starts through, so that nothing outlives its run.

    python -I supervise.py --owner PID [--root PID:START] -- ARGV...

The wrapper becomes ARGV by ``exec`` (same pid: the caller's ``Popen``, signals and log
tails see the real process, the leader of its own session and process group). Before that:

1. ``PR_SET_PDEATHSIG(SIGKILL)``: the kernel kills the process when the thread that forked
   it dies, however the owner died. It covers only this process: vLLM's engine core and
   LMCache's workers are its children.
2. A watchdog is double-forked into the same process group (a member of the group, no
   one's child in it) holding pidfds of the owner, of the run's root (the xdist controller)
   and of the leader. When an owner dies it sends SIGTERM to the whole group and SIGKILL
   after a short grace; when the leader exits it waits for the rest of the group to go,
   then goes itself. It ignores SIGTERM and SIGINT, so a teardown's group SIGTERM cannot
   leave the group unwatched while it shuts down.

Standard library only, and run with ``-I``: no ``PYTHONPATH``, so no fault-injection
``sitecustomize`` in the wrapper. Linux only (``/proc``, ``prctl``, pidfds; without pidfds
the watchdog polls).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
WATCHDOG_NAME = b"sharedkv-watch"  # /proc/PID/comm of the watchdog
GRACE_S = 2.0
POLL_S = 0.1
OWNER_GONE = 125  # exit status when the owner died before the launch could be watched


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3 onwards), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """Clock ticks after boot at which PID started (with the pid, it names one process)."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def running(pid: int, started: int | None = None) -> bool:
    """PID exists, is not a zombie and (if STARTED is given) is the process that started then."""
    fields = proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is PGID (zombies excluded)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = proc_stat(int(entry.name))
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def is_watchdog(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_bytes().strip() == WATCHDOG_NAME
    except OSError:
        return False


def _prctl(option: int, arg: int | bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send SIG to this process when its parent (the thread that forked it)
    dies; if the parent died before the request took, send it now. False without prctl."""
    parent = os.getppid()
    try:
        _prctl(PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


@dataclass
class Watched:
    """A process the watchdog waits on: a pidfd where the kernel has them, else polling."""

    pid: int
    started: int | None
    fd: int | None = None

    @classmethod
    def open(cls, pid: int, started: int | None = None) -> Watched:
        watched = cls(pid, started if started is not None else start_time(pid))
        try:
            watched.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            watched.fd = None
        return watched

    def alive(self) -> bool:
        return running(self.pid, self.started)


def _wait_any(watched: Sequence[Watched], timeout: float | None) -> None:
    """Until one of WATCHED may have exited (or TIMEOUT passed)."""
    fds = [w.fd for w in watched if w.fd is not None]
    if len(fds) < len(watched):  # no pidfd for some: poll
        time.sleep(POLL_S if timeout is None else min(timeout, POLL_S))
        return
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    poller.poll(None if timeout is None else int(timeout * 1000))


def kill_group(pgid: int, grace: float = GRACE_S) -> None:
    """SIGTERM to the group, SIGKILL to what is left after GRACE (this process included)."""
    me = os.getpid()
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not [p for p in group_members(pgid) if p != me]:
            break
        time.sleep(POLL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def watchdog(pgid: int, leader: Watched, owners: Sequence[Watched]) -> NoReturn:
    """Kill the group when an owner dies; leave when the group is empty but for us."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = {0, 1, 2, *(w.fd for w in (leader, *owners) if w.fd is not None)}
    for fd in range(3, max(keep) + 64):
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    with contextlib.suppress(OSError):
        _prctl(PR_SET_NAME, WATCHDOG_NAME)
    me = os.getpid()
    while True:
        if not all(o.alive() for o in owners):
            kill_group(pgid)
            os._exit(0)
        if not leader.alive() and not [p for p in group_members(pgid) if p != me]:
            os._exit(0)
        _wait_any([*owners, leader] if leader.alive() else owners,
                  None if leader.alive() else POLL_S)


def _start_watchdog(leader: Watched, owners: Sequence[Watched]) -> None:
    pgid = os.getpgid(0)
    middle = os.fork()
    if middle == 0:
        try:
            if os.fork() == 0:
                watchdog(pgid, leader, owners)
        finally:
            os._exit(0)
    os.waitpid(middle, 0)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="supervise")
    parser.add_argument("--owner", type=int, required=True,
                        help="pid of the launching process (this process's parent)")
    parser.add_argument("--root", default=None,
                        help="PID:START of the run's root process (the xdist controller)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(list(argv))
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command to run after --")
    return args


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = parse(sys.argv[1:] if argv is None else argv)
    with contextlib.suppress(OSError, AttributeError):  # no prctl: the watchdog still watches
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    owners = [Watched.open(args.owner)]
    if os.getppid() != args.owner:  # the owner died before the parent-death signal was set
        os._exit(OWNER_GONE)
    if args.root:
        pid, _, started = args.root.partition(":")
        root = Watched.open(int(pid), int(started) if started else None)
        if not root.alive():
            os._exit(OWNER_GONE)
        owners.append(root)
    _start_watchdog(Watched.open(os.getpid()), owners)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; the command must not
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(args.command[0], args.command)
    except OSError as exc:
        sys.stderr.write(f"supervise: cannot run {args.command[0]!r}: {exc}\n")
        os._exit(127)


if __name__ == "__main__":
    main()
