"""The service tier's L2 write-failure cell on the stub double (hosts topology, a real
redis-server at its memory limit): both stubs take the same prompts cold at once and some
of their L2 writes are refused; a fresh pair then answers them on B, every hit from the
L2. Clean: answers exact, no hit past what the L2 holds, the audit clean, writes refused.
Wrong bytes loaded from the L2 are wrong answers and audit mismatches. In-process runs of
two 3k requests; a precise skip without redis-server."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.stack.l2.redis_server import missing
from tests.conftest import keep_loaded
from tests.launch_faults import LaunchFaults, Planted, StubFaults
from tests.test_l2_transfer import REQUIRE_REDIS_ENV

keep_loaded("redis", "redis.backoff", "redis.retry")
BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression", "-p",
        "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json", "-k", "l2_write_failure",
        "--sharedkv-kv-audit"]
HOSTS = ["--sharedkv-topology=hosts"]
CHAINS = 2


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, str(CHAINS))


@pytest.fixture
def redis_present() -> None:
    why = missing()  # no redis-server, or no redis-py
    if why is not None:
        if os.environ.get(REQUIRE_REDIS_ENV):
            pytest.fail(f"{REQUIRE_REDIS_ENV} is set: {why}")
        pytest.skip(why)


def _cell(pytester: pytest.Pytester, *args: str, faults: StubFaults | None = None
          ) -> tuple[pytest.RunResult, dict[str, Any]]:
    plugins = [Planted(LaunchFaults(stub=faults))] if faults is not None else []
    result = pytester.runpytest_inprocess(*BASE, *args, plugins=plugins)
    report = json.loads((pytester.path / "r.json").read_text())
    found: dict[str, Any] = next(c for c in report["checks"]
                                 if c["key"].get("step") == "l2 write failure")
    return result, found


@pytest.mark.usefixtures("redis_present")
def test_refused_writes_never_become_a_wrong_answer(pytester: pytest.Pytester) -> None:
    result, cell = _cell(pytester, *HOSTS)
    result.assert_outcomes(passed=1)
    assert (cell["status"], cell["passed"], cell["trials"]) == ("pass", CHAINS, CHAINS)
    detail = cell["detail"]
    assert detail["refused"] > 0 and sum(detail["failed_keys"].values()) > 0, detail
    cached, held = detail["cached_by_request"], detail["held_whole"]
    assert sum(cached.values()) > 0  # some hits came back from the L2
    hits = sum(1 for tokens in cached.values() if tokens)
    assert sum(cached.values()) <= sum(held.values()) * detail["chunk"]
    assert detail["audit"]["compared"] > 0 and detail["audit"]["mismatches"] == 0
    assert all(s["l1"] == 0 for s in detail["splits"].values() if s["retained"])
    result.stdout.fnmatch_lines([f"*L2 WRITE stub (test double): {detail['refused']} L2 "
                                 "write(s) refused while both replicas stored the same "
                                 f"prompts (a Redis at its memory limit): {CHAINS}/{CHAINS} "
                                 f"later answers exact ({hits} with hits from that L2, "
                                 f"{CHAINS - hits} hit nothing), no hit past what it "
                                 "held, the audit clean"])


@pytest.mark.usefixtures("redis_present")
def test_wrong_bytes_loaded_from_the_l2_are_caught(pytester: pytest.Pytester) -> None:
    """B's loads from the pool answer as from other bytes (--corrupt-external): both
    writers' entries may be the one the Redis kept, so a byte flipped by one writer may be
    overwritten by the other's; B's loads in the later pair are wrong whichever it was."""
    result, cell = _cell(pytester, *HOSTS, faults=StubFaults(corrupt_external=True))
    result.assert_outcomes(failed=1)
    assert (cell["kind"], cell["status"]) == ("divergence", "fail")
    assert cell["detail"]["audit"]["mismatches"] > 0
    result.stdout.fnmatch_lines(["*L2 WRITE stub (test double): * L2 write(s) refused *: "
                                 "FAIL (divergence): 0/2 held; request 3k-00*"])
    assert "VERDICT stub (test double): 0/0" not in result.stdout.str()


def test_the_cell_is_the_hosts_topologys(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(*BASE, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*the L2 write-failure cell runs in the hosts topology*"])


def test_the_hit_judge_after_refused_writes() -> None:
    from pytest_sharedkv.report.records import Problem
    from pytest_sharedkv.service.answers import Answer
    from pytest_sharedkv.service.execute import held_hit_problem, refused_void
    from pytest_sharedkv.stack.l2.log import KeySplit

    def judged(cached: int | None, whole: int | None = 3,
               split: KeySplit | None = None) -> str | None:
        found = held_hit_problem(Answer("3k-000", "after-failure", "B", cached_tokens=cached),
                                 whole, 32, split)
        return found.kind if isinstance(found, Problem) else None if found is None \
            else "unknown"

    assert [judged(n) for n in (0, 96, 97, None)] == [None, None, "hits", "unknown"]
    assert judged(64, whole=None) == "unknown"
    assert judged(64, split=KeySplit("x", 2, 94, 2, 0)) == "hits"
    assert judged(64, split=KeySplit("x", 2, 94, 0, 2)) is None
    assert refused_void(0) is not None and refused_void(3) is None
    assert refused_void(None) is None  # unknown, said as such by the cell, not VOID


def test_an_l2_cell_is_judged_from_its_problems_its_error_and_its_void() -> None:
    """The two L2 cells' one judgement (execute.Cell): a problem fails with its kind;
    an error or an unjudged step is unknown; a VOID cell that broke nothing is void; each
    but a pass fails the test."""
    from pytest_sharedkv.report.records import Problem
    from pytest_sharedkv.service.execute import GapCell, WriteCell

    wrong = WriteCell(problems=[Problem("request 3k-000: wrong", "divergence")])
    assert wrong.judged("hits") == ("divergence", "fail")
    assert wrong.failure("l2 write failure") == "request 3k-000: wrong"
    broke = GapCell(gap=4, error="no pair")
    assert broke.judged("hits") == ("error", "unknown")
    assert broke.failure("l2 fault gap") == "l2 fault gap: no pair"
    unread = GapCell(gap=4, unknown=["counters unread"])
    assert (unread.judged("hits"), unread.message()) == (("hits-unknown", "unknown"),
                                                          "counters unread")
    void = WriteCell(void="no write was refused")
    assert void.judged("divergence") == ("divergence", "void")
    assert (void.message(), void.failure("l2 write failure")) == ("no write was refused",) * 2
    assert GapCell(gap=4, requests=2, exact=2).failure("l2 fault gap") is None
