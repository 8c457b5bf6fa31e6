"""GPU leases: exclusive across xdist workers, all-or-nothing, and immune to stale locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.host.devices import Gpu
from pytest_sharedkv.host.leases import LEASE_DIR_NAME, LeaseManager, LeaseTimeout
from pytest_sharedkv.host.runtime_dir import RUNTIME_DIR_ENV, RuntimeDirError, runtime_dir

LOGGING_TESTS = """
import json, os, time
import pytest

LOG = {log!r}

def _hold(lease, name):
    start = time.monotonic()
    assert os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0] in lease.tokens
    time.sleep(0.15)
    with open(os.path.join(LOG, name + ".json"), "w") as fh:
        json.dump({{"tokens": lease.tokens, "start": start, "end": time.monotonic(),
                   "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}}, fh)

@pytest.mark.parametrize("i", range(8))
@pytest.mark.sharedkv_gpu
def test_one(sharedkv_gpu_lease, i):
    _hold(sharedkv_gpu_lease, f"one{{i}}")

@pytest.mark.parametrize("i", range(2))
@pytest.mark.sharedkv_gpu(count=2)
def test_two(sharedkv_gpu_lease, i):
    assert len(set(sharedkv_gpu_lease.tokens)) == 2
    _hold(sharedkv_gpu_lease, f"two{{i}}")
"""


def _intervals(log: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(log.glob("*.json"))]


def _assert_exclusive(records: list[dict[str, Any]]) -> None:
    for a in records:
        for b in records:
            if a is b or not set(a["tokens"]) & set(b["tokens"]):
                continue
            overlap = min(a["end"], b["end"]) - max(a["start"], b["start"])
            assert overlap <= 0, f"two tests held one device at once: {a} {b}"


@pytest.mark.parametrize("devices", ["0,1", "0"])
def test_leases_are_exclusive_under_xdist(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None], devices: str
) -> None:
    fake_gpus(devices)
    log = pytester.mkdir("log")
    pytester.makepyfile(LOGGING_TESTS.format(log=str(log)))
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    records = _intervals(log)
    if devices == "0":
        result.assert_outcomes(passed=8, skipped=2)
        assert len(records) == 8
    else:
        result.assert_outcomes(passed=10)
        assert len(records) == 10
        assert {r["worker"] for r in records} == {"gw0", "gw1"}
    _assert_exclusive(records)


def test_concurrent_runs_on_one_machine_never_share_a_device(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    """Two xdist runs and a plain run at the same time, each with its own basetemp: one
    lock directory per machine and user, so no two tests of any run hold device 0 at once."""
    fake_gpus("0")
    runs = []
    for name, extra in (("xdist-a", ["-n", "2"]), ("xdist-b", ["-n", "2"]), ("plain", [])):
        log = pytester.mkdir(f"log-{name}")
        test_file = pytester.makepyfile(**{f"test_{name.replace('-', '_')}":
                                           LOGGING_TESTS.format(log=str(log))})
        argv = [sys.executable, "-m", "pytest", str(test_file), "-p", "no:cacheprovider",
                f"--basetemp={pytester.path / ('bt-' + name)}", *extra]
        runs.append((log, subprocess.Popen(argv, cwd=pytester.path, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)))
    records = []
    for log, proc in runs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        assert "8 passed, 2 skipped" in out, out
        records += _intervals(log)
    assert len(records) == 24
    _assert_exclusive(records)


def _gpus(n: int) -> list[Gpu]:
    return [Gpu(token=str(i), name=f"fake-gpu-{i}") for i in range(n)]


def test_all_or_nothing_and_holder_in_timeout(tmp_path: Path) -> None:
    a = LeaseManager(tmp_path, _gpus(2), owner="gwA")
    b = LeaseManager(tmp_path, _gpus(2), owner="gwB")
    held = a.acquire(1, timeout=1, what="t::held")
    assert held.tokens == ("0",)
    with pytest.raises(LeaseTimeout, match=r"0: gwA pid=\d+ t::held"):
        b.acquire(2, timeout=0.2)
    # b took nothing while waiting: device 1 is free for anyone
    other = b.acquire(1, timeout=0.2)
    assert other.tokens == ("1",)
    a.release(held)
    b.release(other)
    both = b.acquire(2, timeout=0.2)
    assert both.tokens == ("0", "1")


def _fake_torch(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """A torch whose CUDA starts when the test says (``started["cuda"] = True``)."""
    started = {"cuda": False}
    cuda = types.SimpleNamespace(is_initialized=lambda: started["cuda"],
                                 _cached_device_count=None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    return started


def test_a_binding_lasts_its_test_and_cuda_started_under_it_pins_later_leases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    started = _fake_torch(monkeypatch)
    manager = LeaseManager(tmp_path, _gpus(3), owner="gw0")
    blocker = LeaseManager(tmp_path, _gpus(3), owner="gw1")
    first_block = blocker.acquire(1, timeout=0.2)  # holds device 0
    lease = manager.acquire(1, timeout=0.2)
    assert lease.tokens == ("1",)
    binding = manager.bind(lease)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    manager.unbind(binding)  # CUDA did not start: nothing pins this process
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert "CUDA_DEVICE_ORDER" not in os.environ, "the environment is as it was"
    assert manager.bound is None
    binding = manager.bind(lease)
    started["cuda"] = True  # the test touched CUDA under the lease
    manager.unbind(binding)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2" and manager.bound == ("1",)
    manager.release(lease)
    blocker.release(first_block)
    again = manager.acquire(1, timeout=0.2)
    assert again.tokens == ("1",), "a bound process must keep its device"
    manager.release(again)
    pair = manager.acquire(2, timeout=0.2)
    assert pair.tokens[0] == "1" and len(set(pair.tokens)) == 2


def test_cuda_started_before_the_lease_binds_nothing(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA already saw every device: the lease cannot narrow it, so nothing is pinned."""
    _fake_torch(monkeypatch)["cuda"] = True
    manager = LeaseManager(tmp_path, _gpus(2), owner="gw0")
    lease = manager.acquire(1, timeout=0.2)
    manager.unbind(manager.bind(lease))
    assert manager.bound is None


def test_a_process_shares_its_own_lock_and_other_processes_wait(tmp_path: Path) -> None:
    """A test's lease and the pair's lease of it share one lock in their process (a second
    flock there would wait for the first forever); another process waits for both."""
    worker = LeaseManager(tmp_path, _gpus(1), owner="gw0")
    other = LeaseManager(tmp_path, _gpus(1), owner="gw1")  # its own open file: a process
    test = worker.acquire(1, timeout=0.2, what="t::first")
    pair = worker.share(test, "the pair")
    worker.release(test)
    holder = (tmp_path / "gpu-index-0.holder").read_text()
    assert holder == f"gw0 pid={os.getpid()} the pair\n"
    with pytest.raises(LeaseTimeout, match=r"gw0 pid=\d+ the pair"):
        other.acquire(1, timeout=0.2)
    second = worker.acquire(1, timeout=0.2, what="t::second")  # at once: no deadlock
    assert (tmp_path / "gpu-index-0.holder").read_text().splitlines() == [
        f"gw0 pid={os.getpid()} the pair", f"gw0 pid={os.getpid()} t::second"]
    worker.release(second)
    worker.release(second)  # twice is once
    with pytest.raises(LeaseTimeout):
        other.acquire(1, timeout=0.2)
    worker.release(pair)
    assert not (tmp_path / "gpu-index-0.holder").exists()
    other.release(other.acquire(1, timeout=0.2))
    with pytest.raises(ValueError, match="released"):
        worker.share(pair, "too late")


def test_lock_of_a_killed_process_does_not_block(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from pytest_sharedkv.host.devices import Gpu
        from pytest_sharedkv.host.leases import LeaseManager
        m = LeaseManager(Path({str(tmp_path)!r}), [Gpu("0", "fake")], owner="doomed")
        lease = m.acquire(1, timeout=5, what="crashing test")
        print("held", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        manager = LeaseManager(tmp_path, _gpus(1), owner="next")
        with pytest.raises(LeaseTimeout, match="doomed"):
            manager.acquire(1, timeout=0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # the kernel dropped the dead holder's flock: the first try takes the device (how
        # long that takes is benchmarks/processes.py's to say)
        lease = manager.acquire(1, timeout=0)
        assert lease.tokens == ("0",)
        assert list(tmp_path.glob("*.lock")), "the stale lock file is still there, harmlessly"
    finally:
        proc.kill()
        proc.wait()


def test_leftover_lock_files_from_an_earlier_run(pytester: pytest.Pytester,
                                                 fake_gpus: Callable[[str], None]) -> None:
    fake_gpus("0")
    stale = Path(os.environ[RUNTIME_DIR_ENV]) / LEASE_DIR_NAME
    stale.mkdir(parents=True)
    (stale / "gpu-fake-0.lock").write_text("")
    (stale / "gpu-fake-0.holder").write_text("gw3 pid=999999 crashed::test\n")
    pytester.makepyfile("import pytest\n@pytest.mark.sharedkv_gpu\ndef test_x(): pass\n")
    result = pytester.runpytest("--sharedkv-lease-timeout=2", "-n", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_one_device_is_one_lock_whatever_index_a_run_sees_it_under(tmp_path: Path) -> None:
    """Run A sees the device as index 0, run B (CUDA_VISIBLE_DEVICES=1,...) as index 1: the
    UUID names the lock, so B waits for A's lease."""
    a = LeaseManager(tmp_path, [Gpu("0", "H200", uuid="GPU-aaaa")], owner="run-a")
    b = LeaseManager(tmp_path, [Gpu("1", "H200", uuid="GPU-aaaa")], owner="run-b")
    held = a.acquire(1, timeout=1, what="t::a")
    with pytest.raises(LeaseTimeout, match="run-a"):
        b.acquire(1, timeout=0.2)
    a.release(held)
    b.release(b.acquire(1, timeout=1))
    fake = LeaseManager(tmp_path, [Gpu("0", "fake-gpu-0", fake=True)], owner="fake")
    real = LeaseManager(tmp_path, [Gpu("0", "H200")], owner="real")
    fake_lease = fake.acquire(1, timeout=0.2)
    real.release(real.acquire(1, timeout=0.2))  # a fake device never blocks a real one
    fake.release(fake_lease)


def test_a_lease_orders_devices_as_nvidia_smi_does(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    manager = LeaseManager(tmp_path, _gpus(2), owner="gw0")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    lease = manager.acquire(1, timeout=0.2)
    assert lease.env() == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    binding = manager.bind(lease)
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    manager.unbind(binding)
    assert "CUDA_DEVICE_ORDER" not in os.environ
    manager.release(lease)


def test_runtime_dir_is_per_user_and_private(tmp_path: Path) -> None:
    default = runtime_dir({})
    assert default == Path("/tmp") / f"pytest-sharedkv-{os.getuid()}"
    assert default.stat().st_mode & 0o777 == 0o700
    chosen = runtime_dir({RUNTIME_DIR_ENV: str(tmp_path / "rt")})
    assert chosen == tmp_path / "rt" and chosen.stat().st_mode & 0o777 == 0o700
    (tmp_path / "file").write_text("")
    with pytest.raises(RuntimeDirError, match=f"{RUNTIME_DIR_ENV}=.*not a plain directory"):
        runtime_dir({RUNTIME_DIR_ENV: str(tmp_path / "file")})


def test_an_unusable_runtime_dir_is_a_usage_error(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (pytester.path / "a-file").write_text("")
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(pytester.path / "a-file"))
    pytester.makepyfile("import pytest\n\n@pytest.mark.sharedkv_gpu\ndef test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")  # stops before any test
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {RUNTIME_DIR_ENV}=*a-file: not a directory (it names*"])
