"""The shipped suite's outcomes do not depend on test order: shuffled (a conftest shuffles
the collected items with a seed, as pytest-randomly would, after every other plugin's
reordering) and under a ``-k`` selection, every test ends as it does in file order, with
records of the same kinds and statuses. The case that matters: the triage, which stops the
session's pair for its cells (``PairSlot.release``), runs before the replica tier's test
and the service tests that share that pair; they must find it live, not closed.

On the stub, with a fault the triage's CUDA_LAUNCH_BLOCKING cell removes (so the triage
has cells to run and relaunches a pair for one of them)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from tests.launch_faults import LaunchFaults, Planted, StubFaults

SEED_ENV = "SUITE_ORDER_SEED"
SHUFFLE = f"""
import os, random
import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    seed = os.environ.get({SEED_ENV!r})
    if seed:
        random.Random(int(seed)).shuffle(items)
"""
BASE = ["--pyargs", "pytest_sharedkv.suites", "-p", "no:cacheprovider",
        "-m", "service_regression or replica_pair", "--sharedkv-provider=stub",
        "--sharedkv-settle-s=0.05", "--sharedkv-service-sizes=3k", "--sharedkv-triage",
        "--sharedkv-kv-audit"]
# a fault the triage's CUDA_LAUNCH_BLOCKING cell removes
FAULT = Planted(LaunchFaults(stub=StubFaults(corrupt_external_unless="CUDA_LAUNCH_BLOCKING")))
NOT_SLOW = "not corrupted_kv and not transfer"  # the CPU model matrix; needs lmcache


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str,
         seed: int | None, select: str) -> tuple[list[str], dict[str, Any]]:
    """(the tests in the order they ran, nodeid -> (outcome, kinds and statuses))."""
    if seed is None:
        monkeypatch.delenv(SEED_ENV, raising=False)
    else:
        monkeypatch.setenv(SEED_ENV, str(seed))
    pytester.runpytest_inprocess(*BASE, "-k", select, f"--sharedkv-json={name}.json",
                                 plugins=[FAULT])
    report = json.loads((pytester.path / f"{name}.json").read_text())
    records: dict[str, Counter[tuple[str, str]]] = {}
    for check in report["checks"]:
        records.setdefault(check["nodeid"], Counter())[(check["kind"], check["status"])] += 1
    ran = [t["nodeid"] for t in report["tests"]]
    return ran, {t["nodeid"]: (t["outcome"], records.get(t["nodeid"], Counter()))
                 for t in report["tests"]}


def _position(ran: list[str], name: str, last: bool = False) -> int:
    found = [i for i, nodeid in enumerate(ran) if f"::{name}" in nodeid]
    return found[-1] if last else found[0]


def test_the_suite_ends_alike_in_any_order_and_selection(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, "2")
    pytester.makeconftest(SHUFFLE)
    ran, reference = _run(pytester, monkeypatch, "file-order", None, NOT_SLOW)
    triage = next(v for k, v in reference.items() if "::test_triage" in k)
    assert triage[0] == "passed" and triage[1][("triage", "pass")] == 1, triage
    # in file order the triage is last but the fault catalogue (skipped here: not asked)
    assert _position(ran, "test_triage") == _position(ran, "test_fault_catalogue") - 1 == \
        len(ran) - 2
    # shuffled, and a -k selection: the triage third, before the tests that share its pair
    # (the seed: one whose shuffle of these 28 tests puts the triage there)
    ran, outcomes = _run(pytester, monkeypatch, "shuffled", 24, f"{NOT_SLOW} and not session")
    triage_at = _position(ran, "test_triage")
    assert triage_at < _position(ran, "test_cross_replica_hits_give_exact_answers"), ran
    assert triage_at < _position(ran, "test_kv_audit"), ran
    assert triage_at < _position(ran, "test_identical_requests_in_flight"), ran
    assert triage_at < _position(ran, "test_protocol", last=True), ran
    assert outcomes == {k: reference[k] for k in outcomes}, ran
    assert len(outcomes) == len(reference) - 8  # the sessions' tests left out
