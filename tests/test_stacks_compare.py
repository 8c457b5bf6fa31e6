"""compare names a stack change (LMCache's MP server -> its in-process connector, LMCache ->
vLLM's own offload, one of vLLM's offload connectors -> the other) from what each report
recorded of its launches, as it names an allocator switch; a report that recorded no
launch is unknown, never today's MP server, and unknown is no change. BEFORE is the real
H200 service report (MP server, its launch facts); AFTER is the same report with
in-process replicas."""

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


def test_one_native_connector_for_the_other_is_a_stack_change(mp: Report) -> None:
    """--sharedkv-native-connector offloading against simple: the same integration (vLLM's
    native offload), another connector, named on both sides; the same connector is none."""
    offloading = with_launches(mp, None, {}, {"connector": "OffloadingConnector",
                                              "backend": "CPU"})
    simple = with_launches(mp, None, {}, {"connector": "SimpleCPUOffloadConnector",
                                          "backend": "CPU"})
    found = stack_change(offloading, simple)
    assert found is not None and found[0].kinds == found[1].kinds == {NATIVE}
    assert change_line(found).startswith(
        f"{STACK_CHANGE}: BEFORE ran vLLM native offload (OffloadingConnector, CPU), AFTER "
        "vLLM native offload (SimpleCPUOffloadConnector, CPU): ")
    assert stack_change(simple, offloading) is not None
    assert stack_change(simple, with_launches(mp, None, {}, {
        "connector": "SimpleCPUOffloadConnector", "backend": "CPU"})) is None


def test_the_same_stack_is_no_change(mp: Report) -> None:
    again = Report(Path("again.json"), copy.deepcopy(mp.data), None)
    again.data["environment"]["lmcache"]["version"] = "0.5.7"  # an upgrade, not a change
    assert stack_change(mp, again) is None


def test_a_report_without_launches_is_unknown_not_the_mp_server(mp: Report) -> None:
    silent = with_launches(mp, None, {})
    assert stack_of(silent) is None
    assert stack_change(mp, silent) is None
    assert stack_change(silent, mp) is None


def _compare(capsys: pytest.CaptureFixture[str], tmp_path: Path, before: dict[str, Any],
             after: dict[str, Any], *args: str) -> tuple[int, str]:
    from pytest_sharedkv.cli.compare.main import main

    b, a = tmp_path / "before.json", tmp_path / "after.json"
    b.write_text(json.dumps(before))
    a.write_text(json.dumps(after))
    status = main([str(b), str(a), *args])
    return status, capsys.readouterr().out


def test_a_stack_change_keeps_speed_from_being_judged(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The H200 screening of two sessions (merged: enough block pairs to judge) against
    itself with every cold TTFT 30% slower and a "stack" fact naming the in-process
    connector: shown, not judged (exit 0), until --allow-stack-change judges them (exit 1)."""
    from pytest_sharedkv.cli.merge import main as merge_main

    merged = tmp_path / "merged.json"
    assert merge_main([str(merged), *(str(H200 / "perf" / "h200" / f"perf-27b-compiled-{s}.json")
                                      for s in ("s1", "s2"))]) == 0
    before = json.loads(merged.read_text())
    after = copy.deepcopy(before)
    for o in after["perf"]["observations"]:
        if o["step"] == "cold":
            o["ttft_s"] *= 1.3
    after["facts"] = [*after.get("facts", []), {"name": "stack", "nodeid": "", "value":
                      json.dumps({"connector": "LMCacheConnectorV1", "backend": "redis://"})}]
    status, out = _compare(capsys, tmp_path, before, before)
    assert STACK_CHANGE not in out
    status, out = _compare(capsys, tmp_path, before, after)
    (line,) = [x for x in out.splitlines() if x.startswith(f"{STACK_CHANGE}: ")]
    assert "AFTER LMCache in-process (LMCacheConnectorV1, redis://" in line
    assert line.endswith("speed cells are shown but not judged as regressions (the KV moved "
                         "through another integration); --allow-stack-change judges them")
    assert status == 0 and out.index(line) < out.index("## Correctness"), out
    status, out = _compare(capsys, tmp_path, before, after, "--allow-stack-change")
    assert status == 1 and "significant regression(s)" in out
    assert "speed cells judged anyway (--allow-stack-change)" in out


def test_correctness_is_still_compared_across_a_stack_change(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, mp: Report) -> None:
    after = with_launches(mp, {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
                          {"LMCACHE_CONFIG_FILE": "/tmp/lmcache-A.yaml"}).data
    after["tests"] = [{**t, "outcome": "failed", "message": "B is not A"}
                      for t in after["tests"]]
    status, out = _compare(capsys, tmp_path, mp.data, after)
    (line,) = [x for x in out.splitlines() if x.startswith(f"{STACK_CHANGE}: ")]
    assert line.endswith("; correctness compared as always (no perf screening)")
    assert status == 1 and "new correctness difference(s)" in out


def test_the_usage_lists_allow_stack_change(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_sharedkv.__main__ import USAGE

    assert "[--allow-stack-change]" in USAGE and "STACK CHANGE, unless --allow-stack-change" \
        in " ".join(USAGE.split())


def test_the_mp_servers_l2_is_the_topologys_not_a_stack_change(mp: Report) -> None:
    """The real shared run against the real hosts run (one MP server, L1 only, against
    one per replica over an fs L2): TOPOLOGY DIFFERS names it; no STACK CHANGE besides."""
    hosts = read_report(H200 / "lmcache" / "h200" / "hosts-0.5.6-compiled-fs-mixed.json")
    found = stack_of(hosts)
    assert found is not None and found.kinds == {MP} and "L2 fs" in found.describe()
    assert stack_change(mp, hosts) is None
