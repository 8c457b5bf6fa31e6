"""GPU leases: exclusive across xdist workers, all-or-nothing, and immune to stale locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.devices import Gpu
from pytest_sharedkv.leases import LeaseManager, LeaseTimeout

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


def test_binding_pins_later_leases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    manager = LeaseManager(tmp_path, _gpus(3), owner="gw0")
    blocker = LeaseManager(tmp_path, _gpus(3), owner="gw1")
    first_block = blocker.acquire(1, timeout=0.2)  # holds device 0
    lease = manager.acquire(1, timeout=0.2)
    assert lease.tokens == ("1",)
    manager.bind(lease)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    manager.release(lease)
    blocker.release(first_block)
    again = manager.acquire(1, timeout=0.2)
    assert again.tokens == ("1",), "a bound process must keep its device"
    manager.release(again)
    pair = manager.acquire(2, timeout=0.2)
    assert pair.tokens[0] == "1" and len(set(pair.tokens)) == 2


def test_lock_of_a_killed_process_does_not_block(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from pytest_sharedkv.devices import Gpu
        from pytest_sharedkv.leases import LeaseManager
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
        started = time.monotonic()
        lease = manager.acquire(1, timeout=5)
        assert time.monotonic() - started < 1.0
        assert lease.tokens == ("0",)
        assert list(tmp_path.glob("*.lock")), "the stale lock file is still there, harmlessly"
    finally:
        proc.kill()
        proc.wait()


def test_leftover_lock_files_from_an_earlier_run(pytester: pytest.Pytester,
                                                 fake_gpus: Callable[[str], None]) -> None:
    fake_gpus("0")
    basetemp = pytester.path / "basetemp"
    stale = basetemp / "sharedkv-gpu-leases"
    stale.mkdir(parents=True)
    (stale / "gpu-0.lock").write_text("")
    (stale / "gpu-0.holder").write_text("gw3 pid=999999 crashed::test\n")
    pytester.makepyfile("import pytest\n@pytest.mark.sharedkv_gpu\ndef test_x(): pass\n")
    result = pytester.runpytest("--sharedkv-lease-timeout=2", "-n", "1",
                                f"--basetemp={basetemp}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
