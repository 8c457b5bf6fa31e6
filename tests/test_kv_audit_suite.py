"""The suite's KV audit test (``test_kv_audit``), end to end on the stub provider: the audit
is on by default, and the stub replicas write the audit hook's records (a test double's
digests), so the test's body runs on CPU. A clean pass passes and shows the gate's
zeroed chunk as the audit's positive control; B loading bytes A never stored
(``corrupt-external``) fails by naming the mismatching chunks; ``--no-sharedkv-kv-audit``
launches the replicas without it and says so."""

from __future__ import annotations

import json
import re
from typing import Any

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


def _audit(pytester: pytest.Pytester) -> tuple[dict[str, Any], list[str]]:
    """The inner run's audit record and the audit's notes (what the summary says of it)."""
    report = json.loads((pytester.path / "r.json").read_text())
    audit = next(c for c in report["checks"] if c["key"].get("size") == "audit")
    return audit, [n["text"] for n in report["notes"] if n["nodeid"] == audit["nodeid"]]


def test_a_clean_audit_passes_with_its_positive_control(pytester: pytest.Pytester,
                                                        process_tag: str) -> None:
    result = pytester.runpytest_subprocess(*AUDIT, "--sharedkv-json=r.json")
    result.assert_outcomes(passed=2)  # the gate and the audit
    audit, notes = _audit(pytester)
    assert audit["role"] == "check" and audit["status"] == "pass"
    assert audit["detail"]["compared"] > 0 and audit["detail"]["mismatches"] == []
    assert audit["passed"] == audit["trials"] == audit["detail"]["compared"]
    # every digest attention KV (the stub keeps no recurrent state), over the pass's 30
    # cross-replica requests (4 warm-ups, 8 gate controls, 10 chains, 8 sessions)
    assert audit["detail"]["compared_state"] == 0
    assert len(audit["detail"]["chunks_per_request"]) == 30
    # prose only: the positive control's count is in the note's words, not a record field
    assert ("KV AUDIT n/a positive control: the gate's zeroed chunk 47 showed as a mismatch "
            "in 8 of 8 control requests (8 digests)") in notes
    assert not _stubs_left(process_tag)


def test_bytes_b_loaded_that_a_never_stored_are_named(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, process_tag: str) -> None:
    plant(pytester, StubFaults(corrupt_external=True))
    result = pytester.runpytest_subprocess(*AUDIT, "--sharedkv-json=r.json")
    assert result.ret != 0
    audit, notes = _audit(pytester)
    assert (audit["kind"], audit["status"]) == ("audit-mismatch", "fail")
    assert audit["passed"] < audit["trials"] == audit["detail"]["compared"]
    # B's answer to every measured request diverged, and the audit names the chunks: the
    # record keeps the first 200 mismatches, each said as where and what B loaded
    assert audit["detail"]["diverged"] == [f"3k-00{i}" for i in range(CHAINS)]
    mismatches = audit["detail"]["mismatches"]
    assert 0 < len(mismatches) <= audit["trials"] - audit["passed"]
    assert all(re.fullmatch(r"request [\w-]+ \(cross on B\): chunk \d+, group 0 \(KV\), layer "
                            r"stub: B loaded bytes that differ from what A stored; B's bytes "
                            r"equal no chunk any replica stored", m) for m in mismatches)
    [test] = [t for t in json.loads((pytester.path / "r.json").read_text())["tests"]
              if t["nodeid"] == audit["nodeid"]]
    assert test["outcome"] == "failed" and test["message"].startswith("Failed: request ")
    assert "\n... and " in test["message"]  # the failure names the first few, then a count
    assert any(re.match(r"KV AUDIT n/a: \d+ chunk-group-layer digests compared .*: \d+ "
                        r"mismatching digests in \d+ requests", n) for n in notes), notes
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
