"""The identity tier (issue 50): its table has one shape for every stack; the pair judge
reads data (a miss without the positive control is VOID, any cross-salt hit an isolation
failure, a cross-identity hit with wrong answers an identity failure naming the
dimension); the stub's cells pass clean and fail under each planted fault (salt-blind:
ISOLATION BREACH first in the VERDICT; identity-blind: the dimensions named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.identity.judge import SideResult, judge, pair_status
from pytest_sharedkv.identity.table import TABLE, Dimension, IdentityStack, Side
from pytest_sharedkv.report.records import Kind, Status
from tests.launch_faults import LaunchFaults, Planted, StubFaults

SUITE = str(Path(__file__).resolve().parents[1] / "suites" / "test_identity.py")
STUB = [SUITE, "-p", "no:cacheprovider", "-k", "stub", "--sharedkv-json=r.json"]


def test_every_stack_has_the_same_table_and_every_skip_a_reason() -> None:
    for stack in IdentityStack:
        assert set(TABLE[stack]) == set(Dimension), stack
        for dimension, reach in TABLE[stack].items():
            assert reach.runs or len(reach.skip) > 40, (stack, dimension)
    assert TABLE[IdentityStack.STUB][Dimension.SALT].runs
    assert TABLE[IdentityStack.TRANSFER][Dimension.CHUNK].runs
    assert not TABLE[IdentityStack.TRANSFER][Dimension.LORA].runs  # needs vLLM and a GPU


def side(which: Side, hit: int | None, exact: bool | None = True, cold: int = 0) -> SideResult:
    return SideResult(which, hit, exact, "" if exact is not False else "wrong", cold_hit=cold)


@pytest.mark.parametrize(("dimension", "same", "other", "kinds", "statuses"), [
    # clean: the same identity hit, another did not
    (Dimension.WEIGHTS, side(Side.SAME, 64), side(Side.OTHER, 0, None),
     ("check", "check"), ("pass", "pass")),
    # a legitimate share: another identity hit and answered exactly
    (Dimension.RELEASE, side(Side.SAME, 64), side(Side.OTHER, 64, True),
     ("check", "check"), ("pass", "pass")),
    # the positive control missed: the other side's miss proves nothing
    (Dimension.WEIGHTS, side(Side.SAME, 0), side(Side.OTHER, 0, None),
     ("hits", "check"), ("void", "void")),
    # a cross-identity hit with wrong answers fails naming the dimension
    (Dimension.ROPE, side(Side.SAME, 64), side(Side.OTHER, 64, False),
     ("check", "identity"), ("pass", "fail")),
    # ... and stands even where the positive control missed
    (Dimension.ROPE, side(Side.SAME, 0), side(Side.OTHER, 64, False),
     ("hits", "identity"), ("void", "fail")),
    # a cross-salt hit is an isolation failure whatever the answers
    (Dimension.SALT, side(Side.SAME, 64), side(Side.OTHER, 64, True),
     ("check", "isolation"), ("pass", "fail")),
    (Dimension.SALT, side(Side.SAME, 64), side(Side.OTHER, 0, None, cold=32),
     ("check", "isolation"), ("pass", "fail")),
    # the same identity answering wrong is a plain divergence
    (Dimension.CHUNK, side(Side.SAME, 64, False), side(Side.OTHER, 0, None),
     ("divergence", "check"), ("fail", "void")),
    # a counter that could not be read is unknown, never zero
    (Dimension.LORA, side(Side.SAME, None), side(Side.OTHER, 0, None),
     ("hits-unknown", "check"), ("unknown", "void")),
])
def test_the_pair_judge(dimension: Dimension, same: SideResult, other: SideResult,
                        kinds: tuple[str, str], statuses: tuple[str, str]) -> None:
    verdicts = judge(dimension, same, other)
    assert tuple(str(v.kind) for v in verdicts) == kinds
    assert tuple(str(v.status) for v in verdicts) == statuses
    if "identity" in kinds:
        assert f"IDENTITY {dimension}" in verdicts[1].message
    assert pair_status(verdicts) == (Status.FAIL if "fail" in statuses else
                                     Status.UNKNOWN if "unknown" in statuses else
                                     Status.VOID if "void" in statuses else Status.PASS)


def _checks(pytester: pytest.Pytester) -> dict[tuple[str, str], dict[str, str]]:
    report = json.loads((pytester.path / "r.json").read_text())
    found: dict[tuple[str, str], dict[str, str]] = {}
    for c in report["checks"]:
        if c["tier"] == "identity":
            found.setdefault((c["key"]["dimension"], c["key"]["side"]), {}).update(
                kind=c["kind"], status=c["status"])
    return found


def test_the_stub_table_passes_clean(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(*STUB)
    result.assert_outcomes(passed=7, skipped=2)
    result.stdout.fnmatch_lines(["*VERDICT identity: 7 pair(s) proven*",
                                 "*restart-l2 on stub: an fs L2 is a directory*"])
    checks = _checks(pytester)
    assert len(checks) == 14 and all(c["status"] == "pass" for c in checks.values())


def test_the_salt_blind_fault_is_an_isolation_breach(pytester: pytest.Pytester) -> None:
    """The stub's keys without the salt (the salt-blind fault): the answers stay exact,
    and the salt pair fails as an isolation breach, named first in the VERDICT."""
    faults = Planted(LaunchFaults(stub=StubFaults(ignore_salt=True)))
    result = pytester.runpytest_inprocess(*STUB[:-3], "-k", "stub-salt or stub-weights",
                                          "--sharedkv-json=r.json", plugins=[faults])
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*VERDICT identity: ISOLATION BREACH: a hit across tenants "
                                 "(cache_salt) in salt on stub*"])
    checks = _checks(pytester)
    assert checks[("salt", "other")] == {"kind": str(Kind.ISOLATION), "status": "fail"}
    assert checks[("salt", "same")]["status"] == "pass"
    assert checks[("weights", "other")]["status"] == "pass"  # the answers stay exact


def test_the_identity_blind_fault_fails_naming_each_dimension(
        pytester: pytest.Pytester) -> None:
    """Keys without the model identity: another adapter, weights, RoPE scaling, kv dtype,
    and a restart with a changed configuration hit and answer wrong; the chunk size (a key
    of other token spans) and the salt still hold."""
    faults = Planted(LaunchFaults(stub=StubFaults(identity_blind=True)))
    result = pytester.runpytest_inprocess(*STUB, plugins=[faults])
    result.assert_outcomes(passed=2, failed=5, skipped=2)
    checks = _checks(pytester)
    blind = {"lora", "weights", "rope-scaling", "kv-cache-dtype", "restart-server"}
    assert {d for (d, s), c in checks.items() if c["kind"] == "identity"} == blind
    assert checks[("salt", "other")]["status"] == checks[("chunk-size", "other")]["status"] \
        == "pass"
    result.stdout.fnmatch_lines(["*VERDICT identity: WRONG KV ACROSS IDENTITIES: "
                                 "kv-cache-dtype on stub, lora on stub*"])
