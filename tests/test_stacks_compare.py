"""compare names a stack change (LMCache's MP server -> its in-process connector, LMCache ->
vLLM's own offload) from what each report recorded of its launches, as it names an
allocator switch; a report that recorded no launch is unknown, never today's MP server, and
unknown is no change. BEFORE is the real H200 service report (MP server, its launch facts);
AFTER is the same report with in-process replicas."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.reading import Report, read_report
from pytest_sharedkv.cli.compare.stacks import (
    INPROCESS,
    MP,
    NATIVE,
    STACK_CHANGE,
    change_line,
    stack_change,
    stack_of,
)

H200 = Path(__file__).resolve().parents[1] / "fixtures"
SERVICE = H200 / "lmcache" / "h200" / "service-0.5.6-compiled-lazy-audit.json"
NATIVE_SCREENING = H200 / "perf" / "h200" / "perf-27b-compiled-native1.json"


@pytest.fixture(scope="module")
def mp() -> Report:
    return read_report(SERVICE)


def with_launches(report: Report, argv_change: dict[str, str] | None,
                  env: dict[str, str], stack: dict[str, Any] | None = None) -> Report:
    """REPORT's copy whose vLLM replicas ran with ARGV_CHANGE's --kv-transfer-config
    (None: every launch fact dropped) and ENV, without the MP server; STACK: a "stack"
    fact as the launch configuration records it."""
    data = copy.deepcopy(report.data)
    facts = []
    for fact in data["facts"]:
        if fact["name"] != "launch":
            facts.append(fact)
            continue
        value = json.loads(fact["value"])
        if argv_change is None or not value["name"].startswith("vllm"):
            continue
        argv = value["argv"]
        argv[argv.index("--kv-transfer-config") + 1] = json.dumps(argv_change)
        value["env"].update(env)
        facts.append({**fact, "value": json.dumps(value)})
    if stack is not None:
        facts.append({"name": "stack", "value": json.dumps(stack), "nodeid": ""})
    data["facts"] = facts
    return Report(Path("after.json"), data, None)


def test_mp_server_to_in_process_is_a_stack_change(mp: Report) -> None:
    after = with_launches(mp, {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
                          {"LMCACHE_CONFIG_FILE": "/tmp/lmcache-A.yaml"})
    found = stack_change(mp, after)
    assert found is not None
    before_stack, after_stack = found
    assert before_stack.kinds == {MP} and after_stack.kinds == {INPROCESS}
    assert before_stack.lmcache == after_stack.lmcache == "0.5.6"
    assert change_line(found).startswith(
        f"{STACK_CHANGE}: BEFORE ran LMCache MP server (LMCacheMPConnector, L1 only, "
        "LMCache 0.5.6), AFTER LMCache in-process (LMCacheConnectorV1, LMCache 0.5.6): ")
    # the configuration's own record names the backend
    recorded = with_launches(mp, None, {}, {"connector": "LMCacheConnectorV1",
                                            "backend": "redis://"})
    stack = stack_of(recorded)
    assert stack is not None and stack.describe() == (
        "LMCache in-process (LMCacheConnectorV1, redis://, LMCache 0.5.6)")


def test_lmcache_to_native_offload_is_a_stack_change(mp: Report) -> None:
    native = read_report(NATIVE_SCREENING)
    found = stack_change(mp, native)
    assert found is not None
    assert found[1].kinds == {NATIVE, "no connector"}  # the screening's NATIVE and OFF arms
    assert "LMCache" not in found[1].describe()  # no LMCache connector ran


def test_the_same_stack_is_no_change(mp: Report) -> None:
    again = Report(Path("again.json"), copy.deepcopy(mp.data), None)
    again.data["environment"]["lmcache"]["version"] = "0.5.7"  # an upgrade, not a change
    assert stack_change(mp, again) is None


def test_a_report_without_launches_is_unknown_not_the_mp_server(mp: Report) -> None:
    silent = with_launches(mp, None, {})
    assert stack_of(silent) is None
    assert stack_change(mp, silent) is None
    assert stack_change(silent, mp) is None
