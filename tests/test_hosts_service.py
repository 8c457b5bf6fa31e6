"""The service tier across hosts, end to end on the stub double (one stub server per replica,
sharing an L2 directory): the wait for the L2 after A's step, server 2's own account of
every cross-replica request beside the engines' counters, a planted byte in the L2 caught
by answers and the KV audit, a server 2 that took keys from its own L1 caught by name, and
the evictions each server counted with an L1 smaller than the corpus. In-process runs of a
small plan (two requests of 3k)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from tests.conftest import keep_loaded
from tests.launch_faults import LaunchFaults, Planted, StubFaults

keep_loaded("redis", "redis.backoff", "redis.retry")
BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression", "-p",
        "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-topology=hosts", "--sharedkv-json=r.json"]
CHAINS = 2
SHAREABLE = 3008  # tokens of a 3k request B may take from the pool
KEYS = SHAREABLE // 32


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, str(CHAINS))


def _run(pytester: pytest.Pytester, *args: str, faults: StubFaults | None = None
         ) -> tuple[pytest.RunResult, dict[str, Any]]:
    plugins = [Planted(LaunchFaults(stub=faults))] if faults is not None else []
    result = pytester.runpytest_inprocess(*BASE, *args, plugins=plugins)
    return result, json.loads((pytester.path / "r.json").read_text())


def _step(report: dict[str, Any], size: str, step: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in report["checks"] if c["key"].get("size") == size
                                 and c["key"].get("step") == step)
    return found


def test_a_clean_pass_across_hosts_takes_every_cross_request_from_the_l2(
        pytester: pytest.Pytester) -> None:
    """With an L1 of 150 blocks of 32 stub tokens a server, where one 3k request takes 94:
    both servers evict while they store and retrieve, the L2 still holds everything, every
    answer, hit and digest holds, server 2's split says L2, and the report gives what each
    server counted."""
    result, report = _run(pytester, "-k", "steps_account or chain or audit",
                          "--sharedkv-kv-audit",
                          f"--sharedkv-l1-gib={150 * 32 * 1024 / (1 << 30)}")
    result.assert_outcomes(passed=CHAINS + 2)
    cross = _step(report, "3k", "cross")
    assert (cross["kind"], cross["status"]) == ("hits", "pass"), cross
    hosts = cross["detail"]["hosts"]
    assert {k: hosts[k] for k in ("server", "lookups", "unlogged", "l1", "l2", "retained")} \
        == {"server": "server 2", "lookups": CHAINS, "unlogged": 0, "l1": 0,
            "l2": CHAINS * KEYS, "retained": CHAINS * KEYS}
    assert hosts["l2_wait"]["listed"] and hosts["l2_wait"]["missing"] == []
    assert cross["detail"]["evictions"]["server 2"] > 0
    result.stdout.fnmatch_lines([  # the notes come before the table
        "*EVICTIONS stub (test double) (hosts): server 1 *, server 2 * L1 chunks evicted",
        "*| 3k*| cross*| B*| 2/2*| 6,016*| 0*| 6,016*| 0 L1 / 188 L2 *|*",
        "*VERDICT stub (test double): 2/2 requests exact in every step*"])
    note = next(n["text"] for n in report["notes"] if n["text"].startswith("EVICTIONS"))
    counts = [int(part.rsplit(" ", 1)[1]) for part in
              note.split(": ", 1)[1].split(" L1 chunks")[0].split(", ")]
    assert len(counts) == 2 and all(n > 0 for n in counts), note
    topology = [json.loads(f["value"]) for f in report["facts"] if f["name"] == "topology"]
    assert topology and topology[0]["topology"] == "hosts"
    assert topology[0]["l2"].startswith("fs -> ")
    assert report["environment"]["settings"]["topology"] == "hosts"


def test_a_byte_changed_in_the_l2_is_caught_by_the_answers_and_the_audit(
        pytester: pytest.Pytester) -> None:
    result, report = _run(pytester, "-k", "chain or audit", "--sharedkv-kv-audit",
                          faults=StubFaults(l2_flip_chunk=5))
    result.assert_outcomes(failed=CHAINS + 1)
    chains = [c for c in report["checks"] if c["key"].get("step") == "chain"]
    assert {(c["kind"], c["status"]) for c in chains} == {("divergence", "fail")}
    audit = _step(report, "audit", "kv digests")
    assert (audit["kind"], audit["status"]) == ("audit-mismatch", "fail")
    assert any("chunk 5," in m for m in audit["detail"]["mismatches"]), audit["detail"]


def test_a_cross_request_served_from_server_2s_own_l1_fails_naming_the_split(
        pytester: pytest.Pytester) -> None:
    """Two "hosts" that keep one L1: every answer exact, every hit counted, and still the
    cross-replica step did not cross any host."""
    result, report = _run(pytester, "-k", "steps_account",
                          faults=StubFaults(hosts_share_l1=True))
    result.assert_outcomes(failed=1)
    cross = _step(report, "3k", "cross")
    assert (cross["kind"], cross["status"]) == ("hits", "fail")
    assert cross["passed"] == cross["trials"] == CHAINS  # the answers were exact
    assert cross["detail"]["hosts"]["l1"] == CHAINS * KEYS
    result.stdout.fnmatch_lines([f"*request 3k-000, step cross on replica B: server 2 took "
                                 f"{KEYS} keys from its own L1, which never saw this prompt: "
                                 f"{KEYS}/{KEYS} retained keys ({KEYS} L1, 0 L2)*"])


def test_the_step_split_judge(tmp_path: Path) -> None:
    """split_problems alone: from the L2 passes; from server 2's L1, from nowhere, past a
    gap fail (hits); a request that hit but was never logged is unknown."""
    from pytest_sharedkv.corpus.cases import Case, CaseSet
    from pytest_sharedkv.service.answers import Answer, ServiceRun
    from pytest_sharedkv.service.checks import split_problems
    from pytest_sharedkv.stack.l2.log import KeySplit
    from pytest_sharedkv.stack.steps import step

    cross = step("cross")
    cases = [Case(f"c{i}", "measured", "3k", "w00", "0" * 64, prompt_tokens=3009)
             for i in range(6)]
    run = ServiceRun(CaseSet("copy", 32, cases, []), "pair")
    cached = [3008, 3008, 0, 3008, 128, 3008]
    for case, n in zip(cases, cached, strict=True):
        run.answers[(case.id, "cross")] = Answer(case.id, "cross", "B", cached_tokens=n)
    splits = {("c0", "cross"): KeySplit("r", 94, 94, 0, 94),
              ("c1", "cross"): KeySplit("r", 94, 94, 94, 0),
              ("c3", "cross"): KeySplit("r", 94, 94, 2, 92),
              ("c4", "cross"): KeySplit("r", 4, 94, 0, 4)}
    problems, unknown = split_problems(run, splits, cases, cross)
    assert [(p.split(":")[0], p.kind) for p in problems] == [
        ("request c1, step cross on replica B", "hits"),
        ("request c2, step cross on replica B", "hits"),
        ("request c3, step cross on replica B", "hits")]
    assert "served from nowhere" in problems[1]
    assert unknown == ["request c5, step cross on replica B: 3008 tokens cached, and server 2 "
                       "logged no lookup of it: where they came from is unknown"]
    gapped, _ = split_problems(run, splits, cases[4:5], cross, gap=4)
    assert gapped == []
    past, _ = split_problems(run, splits, cases[:1], cross, gap=4)
    assert [p.kind for p in past] == ["hits"] and "exactly the 4 chunks" in past[0]


def test_one_host_with_evictions_may_stop_short_of_the_prefix_never_pass_it() -> None:
    from pytest_sharedkv.corpus.cases import Case
    from pytest_sharedkv.service.answers import Answer
    from pytest_sharedkv.service.checks import hit_problem
    from pytest_sharedkv.stack.steps import step

    case = Case("3k-000", "measured", "3k", "w00", "0" * 64, prompt_tokens=3009)
    short = Answer("3k-000", "cross", "B", cached_tokens=2048)
    assert hit_problem(case, step("cross"), short) is not None
    assert hit_problem(case, step("cross"), short, evicted=True) is None
    past = Answer("3k-000", "cross", "B", cached_tokens=3040)
    assert hit_problem(case, step("cross"), past, evicted=True) is not None
    local = Answer("3k-000", "local", "A", cached_tokens=2048)
    assert hit_problem(case, step("local"), local, evicted=True) is not None
