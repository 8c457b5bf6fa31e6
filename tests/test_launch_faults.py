"""Faults the self-tests plant in the test doubles are typed values handed in through the
``pytest_sharedkv_launch_faults`` hook: each becomes the double's own flag on the replica
it is meant for, a run without the hook plants none, and a faulted pair is keyed in the
report as a clean one (no key names a fault)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_sharedkv.stack.faults import (
    NO_FAULTS,
    LaunchFaults,
    StubFaults,
    TransferFaults,
    planted,
)
from tests.launch_faults import Planted

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "replica_pair", "-k", "cross_replica",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05"]


@pytest.mark.parametrize(("faults", "a", "b"), [
    (StubFaults(), [], []),
    (StubFaults(corrupt_external=True), [], ["--corrupt-external"]),
    (StubFaults(corrupt_external_unless="X"), [], ["--corrupt-external"]),
    (StubFaults(crash_after=3), [], ["--crash-after", "3"]),
    (StubFaults(ignore_salt=True), ["--ignore-salt"], ["--ignore-salt"]),
    (StubFaults(pool_blocks=100), ["--pool-blocks", "100"], ["--pool-blocks", "100"]),
    (StubFaults(fail_metrics=(2, 19)), [], ["--fail-metrics", "2,19"]),
    (StubFaults(diverge=True), [], ["--diverge"]),
    (StubFaults(no_gate=True), [], []),  # the provider leaves B's gate flags out
])
def test_each_stub_fault_is_the_stubs_own_flag_on_its_replica(
        faults: StubFaults, a: list[str], b: list[str]) -> None:
    assert faults.argv("A", "ON", {}) == a
    assert faults.argv("B", "ON", {}) == b


def test_a_fault_a_control_removes_and_one_the_off_arm_cannot_have() -> None:
    unless = StubFaults(corrupt_external_unless="CUDA_LAUNCH_BLOCKING")
    assert unless.argv("B", "ON", {"CUDA_LAUNCH_BLOCKING": "1"}) == []  # the control's relaunch
    assert StubFaults(pool_blocks=100).argv("B", "OFF", {}) == []  # OFF has no pool
    assert TransferFaults(off_by_one=True).argv() == ["--off-by-one"]
    assert TransferFaults().argv() == []


def _config(found: object) -> Any:
    return SimpleNamespace(hook=SimpleNamespace(
        pytest_sharedkv_launch_faults=lambda config: found))


def test_planted_faults_come_from_the_hook_or_are_none() -> None:
    faults = LaunchFaults(stub=StubFaults(diverge=True))
    assert planted(_config(faults)) is faults
    assert planted(_config(None)) is NO_FAULTS
    with pytest.raises(TypeError, match="returned str, not LaunchFaults"):
        planted(_config("corrupt-external"))


def test_a_planted_fault_reaches_the_stub_and_no_report_key(
        pytester: pytest.Pytester) -> None:
    """In-process, the hook's plugin handed in: B corrupts what it took from the pool, the
    round fails, and its record is keyed exactly as a clean pair's."""
    faults = Planted(LaunchFaults(stub=StubFaults(corrupt_external=True)))
    result = pytester.runpytest(*BASE, "--sharedkv-json=r.json", plugins=[faults])
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    [check] = [c for c in report["checks"] if c["tier"] == "replica_pair"]
    assert check["key"] == {"provider": "stub (test double)", "allocator": "n/a", "delay": "0"}
    assert check["status"] == "fail"
    launches = [json.loads(f["value"]) for f in report["facts"] if f["name"] == "launch"]
    assert ["--corrupt-external" in x["argv"] for x in launches] == [False, True]
