"""Processes the suite starts: own session, logs to a file, readiness, and a teardown that
always kills the whole process group and proves nothing of it is left.

A server started in its own session outlives the command that started it and keeps its
ports, so every launch goes through here and every fixture stops what it started; and
every launch is supervised (``launch.py``): if the run dies before its teardown (SIGKILL,
a CI time limit), the group dies with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_sharedkv.processes.log_errors import failure_context
from pytest_sharedkv.processes.spawn import Launch, spawn
from pytest_sharedkv.processes.supervise import group_members

__all__ = ["ManagedProcess", "ProcessFailed", "free_port", "group_members", "http_ok",
           "tcp_open"]
LOG_TAIL_LINES = 40


class ProcessFailed(RuntimeError):
    """A started process died or never became ready; the message carries the exceptions
    its log shows and its log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tcp_open(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ManagedProcess:
    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.launch: Launch | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ProcessFailed(f"{self.name} was never started")
        return self.proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.launch = spawn(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.cwd)
            self.proc = self.launch.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def failure(self, why: str) -> ProcessFailed:
        """WHY, the exceptions the log shows (a start-up's root cause is often far above
        the wrapper's traceback that ends the log), then a shorter tail."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ProcessFailed(f"{self.name}: {why}\n--- {self.log_path}: (no log) ---")
        return ProcessFailed(f"{self.name}: {why}\n"
                             f"{failure_context(text, str(self.log_path), LOG_TAIL_LINES)}")

    def wait_ready(self, ready: Callable[[], bool], timeout: float, what: str,
                   interval: float = 0.25,
                   abort: Callable[[], str | None] | None = None) -> float:
        """Seconds until READY() held; fails with the log tail if the process exits first,
        or as soon as ABORT() names a reason it never will (a peer's fatal error)."""
        started = time.monotonic()
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise self.failure(f"exited with status {code} before {what}")
            reason = abort() if abort is not None else None
            if reason:
                raise self.failure(f"cannot become {what}: {reason}")
            if ready():
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise self.failure(f"not {what} within {timeout:g}s")
            time.sleep(interval)

    def wait_exit(self, timeout: float, what: str) -> int:
        """The exit status; a process still running after TIMEOUT is stopped and fails."""
        if self.proc is None:
            raise ProcessFailed(f"{self.name} was never started")
        try:
            return int(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            self.stop()
            raise self.failure(f"did not {what} within {timeout:g}s") from None

    def stop(self, grace: float = 10.0) -> list[int]:
        """Terminate the whole group (SIGTERM, then SIGKILL); returns PIDs that survived."""
        if self.proc is None:
            return []
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.proc.poll()
                if not group_members(pgid):
                    break
                time.sleep(0.1)
            if not group_members(pgid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        survivors = group_members(pgid)
        if not survivors and self.launch is not None:
            self.launch.forget()
        return survivors
