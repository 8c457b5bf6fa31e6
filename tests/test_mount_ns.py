"""The size-capped tmpfs of the write-failure cell (``processes/mount_ns.py``): seen only by
the processes entered into its namespace, full at its size (ENOSPC), gone when it is
stopped and when its owner is SIGKILLed; refused with EPERM, named, without CAP_SYS_ADMIN.
Where this host cannot mount a tmpfs at all the tests that need one skip naming why."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_sharedkv.processes.managed import ManagedProcess
from pytest_sharedkv.processes.mount_ns import (
    CappedTmpfs,
    MountRefused,
    namespace_of,
    processes_in,
)

SIZE = 128 << 10
# Root without CAP_SYS_ADMIN: the bounding set limits what exec grants root (setpriv(1)).
NO_SYS_ADMIN = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]


def _mounted(mountpoint: Path, mountinfo: str) -> bool:
    return any(line.split()[4] == str(mountpoint) for line in mountinfo.splitlines())


@pytest.fixture
def tmpfs(tmp_path: Path) -> CappedTmpfs:
    mount = CappedTmpfs(tmp_path, SIZE)
    try:
        mount.start()
    except MountRefused as exc:
        pytest.skip(f"no tmpfs can be mounted here ({exc.step}: "
                    f"{errno.errorcode.get(exc.errno)}): {exc}")
    return mount


def test_the_tmpfs_is_seen_only_inside_full_at_its_size_and_gone_at_stop(
        tmpfs: CappedTmpfs, tmp_path: Path) -> None:
    namespace = tmpfs.namespace
    assert namespace is not None and namespace != namespace_of(os.getpid())
    assert not _mounted(tmpfs.mountpoint, Path("/proc/self/mountinfo").read_text())
    inside = ManagedProcess("inside", tmpfs.enter(["cat", "/proc/self/mountinfo"]),
                            tmp_path / "inside.log")
    inside.start()
    assert inside.wait_exit(30, "exit") == 0
    assert _mounted(tmpfs.mountpoint, inside.log_text().split("\n", 1)[1])
    assert tmpfs.free_bytes() == SIZE
    with pytest.raises(OSError, match="No space left") as full:
        (tmpfs.view / "big").write_bytes(b"x" * (SIZE + 4096))
    assert full.value.errno == errno.ENOSPC
    assert tmpfs.free_bytes() == 0
    assert tmpfs.stop() == []
    assert processes_in(namespace) == []
    assert list(tmpfs.mountpoint.iterdir()) == []  # the host's directory never held it


def test_a_sigkilled_owner_leaves_no_mount(tmpfs: CappedTmpfs, tmp_path: Path) -> None:
    """The owner dies without a teardown: the supervisor's watchdog stops the holder, and
    with the last process of its namespace the kernel frees the tmpfs."""
    tmpfs.stop()
    owner = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path\n"
        "from pytest_sharedkv.processes.mount_ns import CappedTmpfs\n"
        f"m = CappedTmpfs(Path({str(tmp_path / 'owned')!r}), {SIZE}); m.start()\n"
        "print(m.namespace, m.pid, flush=True); time.sleep(600)\n")],
        stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    namespace, holder = owner.stdout.readline().split()
    assert processes_in(namespace) == [int(holder)]
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 15
    while processes_in(namespace) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_in(namespace) == []


def test_without_cap_sys_admin_the_mount_is_refused_naming_eperm(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv(1) to drop CAP_SYS_ADMIN with")
        mount = CappedTmpfs(tmp_path, SIZE, wrap=NO_SYS_ADMIN)
    else:
        mount = CappedTmpfs(tmp_path, SIZE)  # a user: refused as it is
    with pytest.raises(MountRefused) as refused:
        mount.start()
    if refused.value.errno != errno.EPERM:
        pytest.skip(f"refused otherwise than for want of CAP_SYS_ADMIN: {refused.value}")
    assert refused.value.step == "unshare(CLONE_NEWNS)"
    assert "failed with EPERM" in str(refused.value)
    assert "needs CAP_SYS_ADMIN" in str(refused.value)
    assert mount.holder is not None and not mount.holder.alive()


def test_nothing_it_mounts_propagates_back(tmp_path: Path) -> None:
    """Its namespace's mounts are private: started where every mount is shared (as on a
    systemd host; unshare(1) makes such a namespace here), the tmpfs stays its own."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a namespace of shared mounts with")
    mount = CappedTmpfs(tmp_path, SIZE, wrap=["unshare", "--mount", "--propagation", "shared"])
    try:
        mount.start()
    except MountRefused as exc:
        pytest.skip(f"no tmpfs can be mounted here: {exc}")
    try:
        lines = Path(f"/proc/{mount.pid}/mountinfo").read_text().splitlines()
        assert _mounted(mount.mountpoint, "\n".join(lines))
        assert [line for line in lines if " shared:" in line] == []
    finally:
        assert mount.stop() == []
