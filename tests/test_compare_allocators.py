"""``compare`` across an allocator switch (BEFORE ran lazy only, AFTER mixed only: the
operator's --no-l1-use-lazy remedy): each lazy test is judged against its mixed twin, so a
clean mixed run passes instead of listing every lazy test as lost, and a fault of the mixed
run is still new. A test outside the per-allocator tiers keeps its id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.legacy import legacy_renamed_id as _renamed_id
from pytest_sharedkv.cli.compare.main import main

SERVICE = "suites/test_service_regression.py"
ORDERING = "suites/test_ordering.py::test_copy_path_is_stream_ordered[lmcache-lazy-helper-D2H-4KiB]"


def _report(allocator: str, failing: str = "", ordering: bool = True) -> dict[str, Any]:
    ids = [f"{SERVICE}::test_sensitivity_gate[{allocator}]",
           f"{SERVICE}::test_request_chain[3k-000-{allocator}]",
           f"{SERVICE}::test_request_chain[3k-001-{allocator}]"]
    tests = [{"nodeid": i, "tier": "service_regression",
              "outcome": "failed" if i.endswith(f"[{failing}-{allocator}]") else "passed",
              "message": "request diverged" if failing and failing in i else ""} for i in ids]
    if ordering:
        tests.append({"nodeid": ORDERING, "tier": "ordering", "outcome": "passed"})
    checks = [{"tier": "service_regression", "nodeid": ids[0], "kind": "gate", "status": "pass",
               "key": {"provider": "vllm", "allocator": allocator, "delay": "0",
                       "size": "gate", "step": "zeroed chunk"}, "passed": 4, "trials": 4}]
    if failing:
        checks.append({"tier": "service_regression", "nodeid": ids[2], "kind": "divergence",
                       "status": "fail", "message": f"request {failing}: first divergent token",
                       "key": {"provider": "vllm", "allocator": allocator, "delay": "0",
                               "size": "3k", "step": "chain", "case": failing},
                       "passed": 0, "trials": 1})
    tiers: dict[str, Any] = {"service_regression": {}, **({"ordering": {}} if ordering else {})}
    return {"schema": "pytest-sharedkv/1", "tests": tests, "checks": checks, "notes": [],
            "tiers": tiers, "environment": {"settings": {"allocators": [allocator]}}}


def _compare(tmp_path: Path, capsys: pytest.CaptureFixture[str], before: dict[str, Any],
             after: dict[str, Any]) -> tuple[int, str]:
    (tmp_path / "b.json").write_text(json.dumps(before))
    (tmp_path / "a.json").write_text(json.dumps(after))
    status = main([str(tmp_path / "b.json"), str(tmp_path / "a.json")])
    return status, capsys.readouterr().out


def test_the_remedy_that_fixed_lazy_passes_test_for_test(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _compare(tmp_path, capsys, _report("lazy", failing="3k-001"),
                           _report("mixed"))
    assert status == 0, out
    assert ("ALLOCATOR SWITCH: BEFORE ran lazy, AFTER mixed: each lazy test and record of "
            "replica_pair, service_regression is judged against its mixed twin") in out
    assert "RESULT: OK" in out and "lost" not in out


def test_a_fault_of_the_new_allocator_is_new_and_a_missing_twin_is_lost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _compare(tmp_path, capsys, _report("lazy"), _report("mixed", "3k-001"))
    flat = " ".join(out.split())
    assert status == 1
    assert f"| NEW | failed | {SERVICE}::test_request_chain[3k-001-mixed] |" in flat
    assert ("| NEW | divergence | service_regression [provider=vllm, allocator=mixed, "
            "delay=0, size=3k, step=chain, case=3k-001] |") in flat
    status, out = _compare(tmp_path, capsys, _report("lazy"), _report("mixed", ordering=False))
    assert status == 1
    assert f"| NEW | lost | {ORDERING} | passed in BEFORE, not in AFTER |" in " ".join(
        out.split())  # an ordering id keeps its "lazy": that target is no allocator switch


def test_without_a_one_to_one_switch_ids_are_read_as_they_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = _report("lazy")
    both["environment"]["settings"]["allocators"] = ["lazy", "mixed"]
    status, out = _compare(tmp_path, capsys, both, _report("mixed"))
    assert status == 1 and "ALLOCATOR SWITCH" not in out
    assert f"{SERVICE}::test_request_chain[3k-000-lazy] | passed in BEFORE, not in AFTER" in out


def test_only_a_whole_parameter_token_is_renamed() -> None:
    assert _renamed_id("t.py::f[3k-000-lazy]", "lazy", "mixed") == "t.py::f[3k-000-mixed]"
    assert _renamed_id("t.py::f[cuda-lazy-1e8]", "lazy", "mixed") == "t.py::f[cuda-mixed-1e8]"
    assert _renamed_id("t.py::f[lazyish-0]", "lazy", "mixed") == "t.py::f[lazyish-0]"
    assert _renamed_id("t.py::f", "lazy", "mixed") == "t.py::f"


def _with_params(allocator: str, ids: dict[str, str], failing: str = "") -> dict[str, Any]:
    """A service report whose tests recorded their parameters (tests[].params): IDS maps
    each case to the id pytest gave it, which need not name the allocator as a token."""
    tests = [{"nodeid": f"{SERVICE}::test_request_chain[{test_id}]", "tier": "service_regression",
              "outcome": "failed" if case == failing else "passed", "message": "",
              "params": {"sharedkv_replica_pair": [allocator, 0],
                         "sharedkv_service_case": case}} for case, test_id in ids.items()]
    return {"schema": "pytest-sharedkv/1", "tests": tests, "checks": [], "notes": [],
            "tiers": {"service_regression": {}},
            "environment": {"settings": {"allocators": [allocator]}}}


def test_twins_are_matched_by_their_parameters_not_their_ids(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ids that do not carry the allocator as a token (pairA/pairB), or carry its name in a
    case ("lazy-x"): the parameters still say which test is which one's twin; the id rule
    (a report without parameters) would call them lost."""
    before = _with_params("lazy", {"3k-000": "pairA-3k-000", "lazy-x": "lazy-x-lazy"})
    after = _with_params("mixed", {"3k-000": "pairB-3k-000", "lazy-x": "lazy-x-mixed"})
    status, out = _compare(tmp_path, capsys, before, after)
    assert status == 0, out
    assert "ALLOCATOR SWITCH: BEFORE ran lazy, AFTER mixed" in out and "lost" not in out
    status, out = _compare(tmp_path, capsys, before, _with_params(
        "mixed", {"3k-000": "pairB-3k-000", "lazy-x": "lazy-x-mixed"}, failing="lazy-x"))
    assert status == 1
    assert f"| NEW | failed | {SERVICE}::test_request_chain[lazy-x-mixed] |" in " ".join(
        out.split())
    legacy = [{k: v for k, v in t.items() if k != "params"} for t in before["tests"]]
    status, out = _compare(tmp_path, capsys, {**before, "tests": legacy}, after)
    assert status == 1 and out.count("| lost") == 2  # the id rule cannot pair them


def test_a_twin_missing_from_after_is_lost_under_its_own_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _with_params("lazy", {"3k-000": "3k-000-lazy", "3k-001": "3k-001-lazy"})
    after = _with_params("mixed", {"3k-000": "3k-000-mixed"})
    status, out = _compare(tmp_path, capsys, before, after)
    assert status == 1
    assert f"| NEW | lost | {SERVICE}::test_request_chain[3k-001-lazy] | passed in BEFORE, " \
        "not in AFTER |" in " ".join(out.split())
