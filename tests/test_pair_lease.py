"""The session's replica pair holds its GPU lease for as long as its engines live, not only
while a test runs: two xdist workers and a concurrent run, each with a session pair on the
one fake GPU, take the device one after the other. The stub pair stands in for engines on
the GPU (a conftest gives its tests the GPU mark a launched pair's tests carry); every test
writes down what the device's lease holder file said while it ran, and which processes
of the other sessions' pairs were still alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.host.devices import Gpu
from pytest_sharedkv.host.leases import LEASE_DIR_NAME, LeaseManager
from pytest_sharedkv.host.runtime_dir import RUNTIME_DIR_ENV

LOG_ENV = "PAIR_LEASE_LOG"
CONFTEST = """
import json, os, time
from pathlib import Path
import pytest

LOG = Path(os.environ["PAIR_LEASE_LOG"])
HOLDER = Path(os.environ["PAIR_LEASE_HOLDER"])


def pytest_collection_modifyitems(items):
    for item in items:  # the stub stands in for a launched pair's engines on the GPU
        if "sharedkv_replica_pair" in item.fixturenames:
            item.add_marker(pytest.mark.sharedkv_gpu)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def observe(request):
    def snap(pair=None):
        me = os.getpid()
        if pair is not None:
            pids = [pair[n].process.pid for n in ("A", "B")]
            (LOG / f"pids-{me}.json").write_text(json.dumps(pids))
        others = [pid for path in LOG.glob("pids-*.json") if path.name != f"pids-{me}.json"
                  for pid in json.loads(path.read_text()) if _alive(pid)]
        record = {"pid": me, "t": time.monotonic(), "test": request.node.name,
                  "holder": HOLDER.read_text() if HOLDER.exists() else "",
                  "others_alive": others}
        (LOG / f"{me}-{request.node.name}.json").write_text(json.dumps(record))
    return snap
"""
TESTS = """
import pytest

pytestmark = pytest.mark.replica_pair


def test_first(sharedkv_replica_pair, observe):
    observe(sharedkv_replica_pair)


def test_second(sharedkv_replica_pair, observe):
    observe(sharedkv_replica_pair)


def test_after_the_pair_tests(observe):  # no GPU mark: only the pair's own lease is left
    observe()
"""


def _records(log: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(p.read_text()) for p in log.glob("*-test_*.json")),
                  key=lambda r: r["t"])


def test_a_session_pair_keeps_its_gpu_from_workers_and_concurrent_runs(
        pytester: pytest.Pytester, fake_gpus: Callable[[str], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus("0")
    log = pytester.mkdir("log")
    monkeypatch.setenv(LOG_ENV, str(log))
    monkeypatch.setenv("PAIR_LEASE_HOLDER", str(Path(os.environ[RUNTIME_DIR_ENV]) /
                                                LEASE_DIR_NAME / "gpu-fake-0.holder"))
    pytester.makeconftest(CONFTEST)
    test_file = pytester.makepyfile(test_pair=TESTS)
    common = [sys.executable, "-m", "pytest", str(test_file), "-p", "no:cacheprovider",
              "--sharedkv-provider=stub", "--sharedkv-lease-timeout=300"]
    runs = [subprocess.Popen([*common, f"--basetemp={pytester.path / name}", *extra],
                             cwd=pytester.path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for name, extra in (("xdist", ["-n", "2", "--dist", "each"]), ("plain", []))]
    for proc in runs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    records = _records(log)
    sessions = {r["pid"] for r in records}
    assert len(records) == 9 and len(sessions) == 3, records  # gw0, gw1 and the plain run
    for r in records:
        holders = r["holder"].splitlines()
        # only this process held the device, and its pair's own lease is among the holders
        # (after its last pair test too)
        assert holders and all(f" pid={r['pid']} " in h for h in holders), r
        assert any("sharedkv_pair_slot[stub-na-0] (until the pair stops)" in h
                   for h in holders), r
        assert not r["others_alive"], f"another session's pair was alive: {r}"
    # one session after the other: no two sessions' observations interleave
    order = [r["pid"] for r in records]
    assert [pid for i, pid in enumerate(order) if i == 0 or order[i - 1] != pid] == \
        list(dict.fromkeys(order)), order


def _gpus(n: int) -> list[Gpu]:
    return [Gpu(token=str(i), name=f"fake-gpu-{i}") for i in range(n)]


def test_the_pair_takes_its_devices_from_its_lease_not_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launched pair's engines get the lease's devices and device order; os.environ is
    as it was."""
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.config.provider import Provider
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.stack.launch.plan import plan_launch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    manager = LeaseManager(tmp_path / "locks", _gpus(3), owner="gw0")
    lease = manager.acquire(2, timeout=0.2)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = plan_launch(Settings(), Provider.VLLM, log_dir=tmp_path / "logs",
                       cases=CaseSet("copy", 32), model=model, allocator="lazy",
                       lease=lease).spec
    assert spec is not None
    assert spec.devices == ("0", "1") and spec.allocator == "lazy"
    assert dict(spec.server_env) == dict(spec.replica_env) == {"CUDA_DEVICE_ORDER":
                                                               "PCI_BUS_ID"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5" and "CUDA_DEVICE_ORDER" not in os.environ
