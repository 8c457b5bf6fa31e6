"""What the plugin puts on test reports for the process that owns the run.

Plain values under fixed names: xdist serialises a report's ``user_properties`` and its
extra attributes, so the controller reads them exactly as a run without xdist does.
"""

from __future__ import annotations

from typing import Any

import pytest

USER_PROPERTY = "sharedkv"  # user_properties entry: the test's check records, notes, facts
# attribute: the perf tier's PerfRun, as JSON (junitxml writes user_properties, not this)
PERF_ATTRIBUTE = "sharedkv_perf_run"
# user_properties entry: where that screening is (the JSON report, its digest), for junitxml
PERF_PROPERTY = "sharedkv_perf"
ITEM_PERF = pytest.StashKey[dict[str, Any]]()  # item stash: that screening, once attached
REPORT_TIER = "sharedkv_tier"  # attribute: the item's tier, from its markers
# attribute: the skip reason of a gated test that --sharedkv-require-gpu turned into a failure
REQUIRE_GPU_FLAG = "sharedkv_require_gpu"
