"""Launched processes are supervised: they keep their pid, their group has a watchdog, the
group dies with its owner however the owner dies, and a later run reaps only what it can
prove an earlier run started. SIGTERM becomes Ctrl-C only where the plugin is used."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_sharedkv.host.runtime_dir import RUNTIME_DIR_ENV
from pytest_sharedkv.processes import reaper
from pytest_sharedkv.processes.managed import ManagedProcess, group_members
from pytest_sharedkv.processes.supervise import is_watchdog, running, start_time

SLEEPER = ("import os, subprocess, sys, time; "
           "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
           "print(os.getpid(), child.pid, flush=True); time.sleep(600)")

OWNER = """
import subprocess, sys, time
from pytest_sharedkv.processes.spawn import spawn
launch = spawn([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
leader, child = launch.proc.stdout.readline().split()
print(leader, child, flush=True)
time.sleep(600)
"""


def watchdogs(pgid: int) -> list[int]:
    return [p for p in group_members(pgid) if is_watchdog(p)]


def wait_until(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(predicate())  # type: ignore[operator]


@contextlib.contextmanager
def owner_with_launch() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A separate 'pytest' process that launched a leader with a child of its own."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, SLEEPER], stdout=subprocess.PIPE,
                             text=True)
    leader = child = 0
    try:
        assert owner.stdout is not None
        leader, child = (int(x) for x in owner.stdout.readline().split())
        assert wait_until(lambda: watchdogs(leader))
        yield owner, leader, child
    finally:
        owner.kill()
        owner.wait()
        for pid in (leader, child, *watchdogs(leader)):
            with contextlib.suppress(OSError):
                if pid:
                    os.kill(pid, signal.SIGKILL)


def test_supervised_process_keeps_its_pid_and_its_group_has_a_watchdog(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", [sys.executable, "-c", SLEEPER], tmp_path / "s.log")
    proc.start()
    try:
        assert proc.wait_ready(lambda: len(proc.log_text().splitlines()) == 2, 30, "up") < 30
        leader, child = (int(x) for x in proc.log_text().splitlines()[-1].split())
        assert leader == proc.pid  # the wrapper became the command: same pid, same Popen
        assert wait_until(lambda: len(watchdogs(proc.pid)) == 1)
        assert sorted(group_members(proc.pid)) == sorted([proc.pid, child, *watchdogs(proc.pid)])
        env = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_DEVICE_ORDER=PCI_BUS_ID" in env
        records = list((Path(os.environ[RUNTIME_DIR_ENV]) / "launched").glob("*.json"))
        assert [json.loads(r.read_text())["pid"] for r in records] == [proc.pid]
    finally:
        assert proc.stop(grace=2) == []
    assert not list((Path(os.environ[RUNTIME_DIR_ENV]) / "launched").glob("*.json"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_group_dies_with_its_owner(sig: signal.Signals) -> None:
    with owner_with_launch() as (owner, leader, child):
        members = group_members(leader)
        assert {leader, child} <= set(members) and len(members) == 3
        owner.send_signal(sig)
        assert wait_until(lambda: not group_members(leader)), \
            f"survivors: {group_members(leader)}"


def test_a_later_run_reaps_only_what_it_can_prove(tmp_path: Path) -> None:
    with owner_with_launch() as (owner, leader, child):
        (watchdog,) = watchdogs(leader)
        os.kill(watchdog, signal.SIGKILL)  # as if killed with the owner: nobody watches now
        owner.kill()
        owner.wait()
        assert wait_until(lambda: not running(leader))  # the parent-death signal
        assert running(child)  # ...covers only the direct child: a grandchild is left
        registry = Path(os.environ[RUNTIME_DIR_ENV]) / "launched"
        (record,) = registry.glob("*.json")
        # a record whose pid another process took since: it must not be touched
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                    start_new_session=True)
        reused = {"launch_id": "gone-1", "pid": stranger.pid, "pgid": stranger.pid,
                  "start_time": 1, "argv": ["x"], "owner_pid": 999_999_999, "owner_start": 1}
        (registry / "gone-1.json").write_text(json.dumps(reused))
        # a record of a live owner (another run, still going) is not ours to reap
        mine = {**reused, "launch_id": "live-1", "owner_pid": os.getpid(),
                "owner_start": start_time(os.getpid())}
        (registry / "live-1.json").write_text(json.dumps(mine))
        try:
            lines = reaper.reap()
            assert not running(child)
            assert len(lines) == 1 and f"[{child}]" in lines[0] and "which is gone" in lines[0]
            assert running(stranger.pid)
            assert not record.exists() and not (registry / "gone-1.json").exists()
            assert (registry / "live-1.json").exists()
        finally:
            stranger.kill()
            stranger.wait()


SIGNAL_STATE = """
import signal
import pytest

def test_state(pytestconfig):
    handler = signal.getsignal(signal.SIGTERM)
    print("SIGTERM handler:", "default" if handler == signal.SIG_DFL else handler)
"""


def test_sigterm_is_left_alone_where_sharedkv_is_not_used(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SIGNAL_STATE)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*SIGTERM handler: default"])


def test_sigterm_becomes_ctrl_c_where_sharedkv_is_used(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SIGNAL_STATE.replace("(pytestconfig)", "(sharedkv_settings)"))
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*SIGTERM handler: <pytest_sharedkv.processes.interrupts._Handler *>"])


def test_a_projects_own_sigterm_handler_is_kept(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import signal
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
    """)
    pytester.makepyfile(SIGNAL_STATE.replace("(pytestconfig)", "(sharedkv_settings)"))
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*SIGTERM handler: <function mine *>"])


def test_a_launch_from_a_short_lived_thread_outlives_the_thread(tmp_path: Path) -> None:
    """The parent-death signal follows the thread that forked: launches fork from one
    long-lived thread, so a fixture's worker thread ending kills nothing."""
    import threading

    proc = ManagedProcess("sleeper", [sys.executable, "-c", SLEEPER], tmp_path / "t.log")

    def fixture_thread() -> None:  # starts it and sees it up (its parent-death signal is set)
        proc.start()
        proc.wait_ready(lambda: len(proc.log_text().splitlines()) == 2, 30, "up")

    thread = threading.Thread(target=fixture_thread)
    thread.start()
    thread.join()
    try:
        time.sleep(0.5)
        assert proc.alive(), "killed when the thread that started it ended"
    finally:
        assert proc.stop(grace=2) == []


POOL_OWNER = """
import sys
from pytest_sharedkv.pinned_pool.child import child_env, run_child
run_child([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); "
           "time.sleep(600)"], child_env(None), 600, "held pool")
"""


def test_a_pinned_pool_child_dies_with_its_run(process_tag: str) -> None:
    from tests.process_tags import tagged

    owner = subprocess.Popen([sys.executable, "-c", POOL_OWNER])
    try:
        def child() -> list[int]:
            return [p.pid for p in tagged(process_tag) if "time.sleep(600)" in p.cmdline
                    and p.pid != owner.pid and not is_watchdog(p.pid)]

        assert wait_until(lambda: len(child()) == 1, 60)
        owner.kill()
        owner.wait()
        assert wait_until(lambda: not child()), f"survivors: {child()}"
    finally:
        owner.kill()
        owner.wait()


def test_a_launch_works_without_a_usable_shared_directory(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is lost (the next run cannot reap it), the supervision is not."""
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "not-a-dir"))
    from pytest_sharedkv.processes import spawn as spawn_module
    monkeypatch.setattr(spawn_module, "_REAPED", set())
    proc = ManagedProcess("sleeper", [sys.executable, "-c", SLEEPER], tmp_path / "n.log")
    proc.start()
    try:
        assert wait_until(lambda: len(watchdogs(proc.pid)) == 1)
        assert proc.launch is not None and proc.launch.record is None
    finally:
        assert proc.stop(grace=2) == []
