"""The suite's KV audit test (``test_kv_audit``), end to end on the stub provider: the audit
is on by default, and the stub replicas write the audit hook's records (a test double's
digests), so the test's body runs on CPU. A clean pass passes and shows the gate's
zeroed chunk as the audit's positive control; B loading bytes A never stored
(``corrupt-external``) fails by naming the mismatching chunks; ``--no-sharedkv-kv-audit``
launches the replicas without it and says so."""

from __future__ import annotations

import json

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from tests.launch_faults import StubFaults, plant
from tests.test_service_suite import BASE, CHAINS, _stubs_left

AUDIT = [*BASE, "-k", "kv_audit or gate"]  # no option: the audit is on by default


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service suite's small plan (its fixture is not autouse here): the audit reads
    every cross-replica request the pass sends, 10 of them are plumbing enough."""
    monkeypatch.setenv(MEASURED_ENV, str(CHAINS))


def test_a_clean_audit_passes_with_its_positive_control(pytester: pytest.Pytester,
                                                        process_tag: str) -> None:
    result = pytester.runpytest_subprocess(*AUDIT, "--sharedkv-json=r.json")
    result.assert_outcomes(passed=2)  # the gate and the audit
    result.stdout.fnmatch_lines([
        "*KV AUDIT n/a: * chunk-group-layer digests compared (* attention KV, 0 recurrent "
        "state) over * cross-replica requests (*)*",
        "*KV AUDIT n/a positive control: the gate's zeroed chunk 47 showed as a mismatch in "
        "8 of 8 control requests",
    ])
    report = json.loads((pytester.path / "r.json").read_text())
    audit = next(c for c in report["checks"] if c["key"].get("size") == "audit")
    assert audit["role"] == "check"
    assert audit["detail"]["compared"] > 0 and audit["detail"]["mismatches"] == []
    assert audit["passed"] == audit["trials"] == audit["detail"]["compared"]
    assert not _stubs_left(process_tag)


def test_bytes_b_loaded_that_a_never_stored_are_named(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, process_tag: str) -> None:
    plant(pytester, StubFaults(corrupt_external=True))
    result = pytester.runpytest_subprocess(*AUDIT, "-rf")
    assert result.ret != 0
    result.stdout.fnmatch_lines([
        # the first lines name whichever request B loaded first (requests run in parallel)
        "request * (cross on B): chunk *, group 0 (KV), layer stub: B loaded bytes that "
        "differ from what A stored; B's bytes equal no chunk any replica stored",
        "... and * more",
        "*KV AUDIT n/a: * mismatching digests in * requests*",
        "FAILED *test_kv_audit[[]stub[]] - Failed: request *",
    ])
    assert not _stubs_left(process_tag)


def test_the_off_switch_launches_no_audit_and_says_which_switch(
        pytester: pytest.Pytester, process_tag: str) -> None:
    result = pytester.runpytest_subprocess(*AUDIT, "--no-sharedkv-kv-audit", "-rs",
                                           "--sharedkv-json=r.json")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*the in-engine KV audit is off (--no-sharedkv-kv-audit)*"])
    report = json.loads((pytester.path / "r.json").read_text())
    launches = [json.loads(f["value"]) for f in report["facts"] if f["name"] == "launch"]
    assert launches and not any("--kv-audit" in launch["argv"] for launch in launches)
    assert not any(c["key"].get("size") == "audit" for c in report["checks"])
    assert not _stubs_left(process_tag)
