"""An allocator switch: BEFORE ran one L1 allocator and AFTER another (the operator's
``--no-l1-use-lazy`` remedy, lazy -> mixed). The tiers launched per allocator name it in
their tests' parameters and record keys, so without a mapping every BEFORE test would be
"lost"; with it, each is read as its twin under AFTER's allocator and judged test for test.

A test's twin is the AFTER test of the same function whose parameters (the report's
``tests[].params``) are BEFORE's with the allocator swapped; a report written before tests
recorded their parameters is read by the legacy rule (``legacy.legacy_renamed_id``)."""

from __future__ import annotations

import copy
import json
from typing import Any

from pytest_sharedkv.cli.compare.legacy import legacy_renamed_id
from pytest_sharedkv.cli.compare.reading import Report, setting_of

# The tiers whose tests --sharedkv-allocators parametrizes (one launched server each).
ALLOCATOR_TIERS = frozenset({"replica_pair", "service_regression"})


def allocators_of(report: Report) -> list[str] | None:
    found = setting_of(report, "allocators")
    return [str(a) for a in found] if isinstance(found, list) else None


def switch(before: Report, after: Report) -> tuple[str, str] | None:
    """(BEFORE's allocator, AFTER's) where each ran exactly one and they differ."""
    b, a = allocators_of(before), allocators_of(after)
    if b is None or a is None or len(b) != 1 or len(a) != 1 or b == a:
        return None
    return b[0], a[0]


def _per_allocator(report: Report) -> list[dict[str, Any]]:
    return [t for t in report.data.get("tests", [])
            if isinstance(t, dict) and t.get("tier") in ALLOCATOR_TIERS]


def records_params(report: Report) -> bool:
    """Whether every per-allocator test of REPORT recorded its parameters."""
    return all(isinstance(t.get("params"), dict) for t in _per_allocator(report))


def _swapped(value: Any, old: str, new: str) -> Any:
    """VALUE (a test's parameters) with every parameter value OLD read as NEW."""
    if isinstance(value, dict):
        return {k: _swapped(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_swapped(v, old, new) for v in value]
    return new if value == old else value


def _function(nodeid: str) -> str:
    """The test function a node id names, without its parameters' id."""
    return nodeid.partition("[")[0]


def _twin(test: dict[str, Any]) -> tuple[str, str]:
    return _function(str(test["nodeid"])), json.dumps(test["params"], sort_keys=True)


def twin_ids(before: Report, after: Report, old: str, new: str) -> dict[str, str]:
    """BEFORE's per-allocator node ids that ran OLD -> the id of their NEW twin in AFTER,
    matched by parameters; one without a twin keeps its id (so it is lost)."""
    if not (records_params(before) and records_params(after)):
        return {str(t.get("nodeid", "")): legacy_renamed_id(str(t.get("nodeid", "")), old, new)
                for t in _per_allocator(before)}
    theirs = {_twin(t): str(t["nodeid"]) for t in _per_allocator(after)}
    renamed = {}
    for test in _per_allocator(before):
        nodeid, params = str(test["nodeid"]), test["params"]
        swapped = _swapped(params, old, new)
        if swapped != params:
            twin = {**test, "params": swapped}
            renamed[nodeid] = theirs.get(_twin(twin), nodeid)
    return renamed


def as_twin(report: Report, old: str, new: str, after: Report) -> Report:
    """REPORT read as if it had run allocator NEW where it ran OLD: the ids of its
    per-allocator tests (their twins in AFTER) and the allocator of its records (a copy;
    the file is untouched)."""
    data: dict[str, Any] = copy.deepcopy(report.data)
    renamed = twin_ids(report, after, old, new)
    for test in data.get("tests", []):
        if isinstance(test, dict) and str(test.get("nodeid", "")) in renamed:
            test["nodeid"] = renamed[str(test["nodeid"])]
    for check in data.get("checks", []):
        if not isinstance(check, dict) or check.get("tier") not in ALLOCATOR_TIERS:
            continue
        key = check.get("key")
        if isinstance(key, dict) and key.get("allocator") == old:
            key["allocator"] = new
        if check.get("nodeid") in renamed:
            check["nodeid"] = renamed[str(check["nodeid"])]
    return Report(report.path, data, report.perf)


def switch_line(found: tuple[str, str]) -> str:
    old, new = found
    return (f"ALLOCATOR SWITCH: BEFORE ran {old}, AFTER {new}: each {old} test and record of "
            f"{', '.join(sorted(ALLOCATOR_TIERS))} is judged against its {new} twin")
