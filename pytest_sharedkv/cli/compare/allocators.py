"""An allocator switch: BEFORE ran one L1 allocator and AFTER another (the operator's
``--no-l1-use-lazy`` remedy, lazy -> mixed). The tiers launched per allocator name it in
their test ids and record keys, so without a mapping every BEFORE test would be "lost";
with it, each is read as its twin under AFTER's allocator and judged test for test."""

from __future__ import annotations

import copy
import re
from typing import Any

from pytest_sharedkv.cli.compare.reading import Report, setting_of

# The tiers whose tests --sharedkv-allocators parametrizes (one launched server each).
ALLOCATOR_TIERS = frozenset({"replica_pair", "service_regression"})
_PARAMS = re.compile(r"\[(?P<params>[^\]]*)\]$")


def allocators_of(report: Report) -> list[str] | None:
    found = setting_of(report, "allocators")
    return [str(a) for a in found] if isinstance(found, list) else None


def switch(before: Report, after: Report) -> tuple[str, str] | None:
    """(BEFORE's allocator, AFTER's) where each ran exactly one and they differ."""
    b, a = allocators_of(before), allocators_of(after)
    if b is None or a is None or len(b) != 1 or len(a) != 1 or b == a:
        return None
    return b[0], a[0]


def _renamed_id(nodeid: str, old: str, new: str) -> str:
    match = _PARAMS.search(nodeid)
    if match is None:
        return nodeid
    tokens = [new if t == old else t for t in match["params"].split("-")]
    return nodeid[:match.start()] + "[" + "-".join(tokens) + "]"


def as_twin(report: Report, old: str, new: str) -> Report:
    """REPORT read as if it had run allocator NEW where it ran OLD: the ids of its
    per-allocator tests and the allocator of its records (a copy; the file is untouched)."""
    data: dict[str, Any] = copy.deepcopy(report.data)
    renamed: dict[str, str] = {}
    for test in data.get("tests", []):
        if isinstance(test, dict) and test.get("tier") in ALLOCATOR_TIERS:
            nodeid = str(test.get("nodeid", ""))
            renamed[nodeid] = test["nodeid"] = _renamed_id(nodeid, old, new)
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
