"""The replica tier's transfer check across hosts (suites/test_replica_pair.py,
test_transfer_across_hosts): in the hosts topology each case of the model-free check
over the session's L2 becomes a record of the tier with its kind and status, and a case
that failed fails the test; in the shared topology it is a skip that says why. The real
servers' run (stack.l2_transfer.run_across_hosts through real LMCache servers, Redis
and fs) is tests/test_l2_transfer.py's; here check_through is replaced by its outcomes,
so the wiring costs no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.report.records import Problem
from pytest_sharedkv.stack.checks import l2_transfer
from pytest_sharedkv.stack.checks.l2_transfer import HostsOutcome, record_verdict
from tests.conftest import keep_loaded

# the replica tier's modules import these; their extensions do not survive a second import
keep_loaded("torch", "lmcache", "redis", "redis.backoff", "redis.retry")

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "replica_pair", "-p", "no:cacheprovider",
        "--sharedkv-provider=stub", "-k", "transfer_across_hosts", "--sharedkv-json=r.json", "-rs"]


def _outcomes(wrong: bool) -> dict[str, HostsOutcome]:
    found = {"l2": HostsOutcome("l2", "fs", "none"),
             "corrupt": HostsOutcome("corrupt", "fs", "corrupt"),
             "gap": HostsOutcome("gap", "fs", "gap"),
             "no-l2": HostsOutcome("no-l2", "none", "none")}
    if wrong:
        found["gap"].problems.append(Problem("server 2 hit 2048 of 2048 tokens with "
                                             "key 4 failing to load; expected 128", "hits"))
    return found


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def fake(l2: Any, workdir: Path, salt: str, gap: int) -> dict[str, HostsOutcome]:
        calls.append({"l2": l2.describe(), "gap": gap, "salt": salt})
        return _outcomes(wrong=WRONG[0])

    monkeypatch.setattr(l2_transfer, "check_through", fake)
    return calls


WRONG = [False]


def _records(pytester: pytest.Pytester) -> dict[str, tuple[str, str, str]]:
    report = json.loads((pytester.path / "r.json").read_text())
    return {c["key"]["step"]: (c["kind"], c["status"], c["role"]) for c in report["checks"]}


def test_each_case_is_a_record_of_the_tier(pytester: pytest.Pytester,
                                           checked: list[dict[str, Any]]) -> None:
    WRONG[0] = False
    result = pytester.runpytest_inprocess(*BASE, "--sharedkv-topology=hosts",
                                          "--sharedkv-l2-fault-gap=3")
    result.assert_outcomes(passed=1)
    assert len(checked) == 1 and checked[0]["gap"] == 3
    assert checked[0]["l2"].startswith("fs -> ")
    assert _records(pytester) == {
        "across hosts: l2": ("bytes", "pass", "check"),
        "across hosts: corrupt": ("bytes", "pass", "negative-control"),
        "across hosts: gap": ("bytes", "pass", "negative-control"),
        "across hosts: no-l2": ("bytes", "pass", "negative-control")}


def test_a_case_that_failed_fails_the_test(pytester: pytest.Pytester,
                                           checked: list[dict[str, Any]]) -> None:
    WRONG[0] = True
    try:
        result = pytester.runpytest_inprocess(*BASE, "--sharedkv-topology=hosts")
    finally:
        WRONG[0] = False
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gap: server 2 hit 2048 of 2048 tokens with key 4*"])
    assert _records(pytester)["across hosts: gap"] == ("hits", "fail", "negative-control")


def test_the_shared_topology_skips_it(pytester: pytest.Pytester,
                                      checked: list[dict[str, Any]]) -> None:
    result = pytester.runpytest_inprocess(*BASE)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*the transfer check across hosts runs in the hosts "
                                 "topology*"])
    assert checked == []


def test_the_record_kinds() -> None:
    def verdict(kind: str | None, void: str | None = None) -> tuple[str, str]:
        outcome = HostsOutcome("c", "fs", "none", void=void)
        if kind is not None:
            outcome.problems.append(Problem("x", kind))
        return record_verdict(outcome)

    assert verdict(None) == ("bytes", "pass")
    assert [verdict(k) for k in ("leak", "hits", "source", "bytes", "l2", "process")] == [
        ("isolation", "fail"), ("hits", "fail"), ("hits", "fail"), ("bytes", "fail"),
        ("hits", "fail"), ("error", "fail")]
    assert verdict(None, void="VOID: unsupported") == ("bytes", "void")
