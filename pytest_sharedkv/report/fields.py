"""What the plugin puts on test reports for the process that owns the run.

Plain values under fixed names: xdist serialises a report's ``user_properties`` and its
extra attributes, so the controller reads them exactly as a run without xdist does.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

import pytest

USER_PROPERTY = "sharedkv"  # user_properties entry: the test's check records, notes, facts
# attribute: the perf tier's PerfRun, as JSON (junitxml writes user_properties, not this)
PERF_ATTRIBUTE = "sharedkv_perf_run"
# user_properties entry: where that screening is (the JSON report, its digest), for junitxml
PERF_PROPERTY = "sharedkv_perf"
ITEM_PERF = pytest.StashKey[dict[str, Any]]()  # item stash: that screening, once attached
REPORT_TIER = "sharedkv_tier"  # attribute: the item's tier, from its markers
# attribute: the item's parameters as plain data (params_of), so that compare can match a
# test by what it ran instead of parsing its id
REPORT_PARAMS = "sharedkv_params"
# attribute: the skip reason of a gated test that --sharedkv-require-gpu turned into a failure
REQUIRE_GPU_FLAG = "sharedkv_require_gpu"
# attribute: the ids of the records on this report that an xdist worker also spooled
# (report/spool.py), so the controller keeps each record once
SPOOLED_ATTRIBUTE = "sharedkv_spooled"


def plain(value: object) -> Any:
    """VALUE as JSON and xdist carry it: scalars as they are, an enum as its value,
    sequences as lists, a dataclass as its fields; anything else by its type's name only
    (never its repr, which may hold an address and differ from run to run)."""
    if isinstance(value, Enum):
        return plain(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__qualname__}>"


def params_of(item: pytest.Item) -> dict[str, Any]:
    """The item's parameters by argument name ({} where it is not parametrized)."""
    callspec = getattr(item, "callspec", None)
    params = getattr(callspec, "params", None) or {}
    return {str(name): plain(value) for name, value in params.items()}


def add_params(report: pytest.TestReport, item: pytest.Item) -> None:
    """Put ITEM's parameters on its REPORT (``REPORT_PARAMS``), for the controller."""
    setattr(report, REPORT_PARAMS, params_of(item))
