"""The service tier's identical requests in flight together (LMCache #4463's later report:
four identical greedy requests sent together, four answers), on the stub double: one
prompt cold on A, then K identical requests of it at once to one replica (B on a shared
pool, A on native offload); every answer exact and all K equal, each hit as the stack's
expected hits say. A planted fault (identical requests in flight together answer
differently) fails the check naming the request and how many distinct answers came back.
And the in-process stack with vLLM's prefix caching off (#4463's later configuration):
its option, its launch, its expected hits, and its usage error on another stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.corpus.cases import Case
from pytest_sharedkv.service.answers import Answer, StepTotals
from pytest_sharedkv.service.checks import hit_problem, totals_problems
from pytest_sharedkv.service.expected_hits import expected_hits
from pytest_sharedkv.stack.launch import stacks as stack_launch
from pytest_sharedkv.stack.launch.providers import build_vllm_pair
from pytest_sharedkv.stack.steps import step
from tests.launch_faults import StubFaults, plant
from tests.test_stacks_inprocess_tiers import ATTENTION
from tests.test_stacks_wiring import cases, spec_for

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json", "-k", "in_flight"]
CHAINS = 4
SHAREABLE = 3008  # a 3k request's 3009 tokens, one left to compute
CASE = Case("3k-000", "measured", "3k", "", "0" * 64, SHAREABLE + 1)


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, str(CHAINS))


def _cell(pytester: pytest.Pytester) -> dict[str, Any]:
    report = json.loads((pytester.path / "r.json").read_text())
    found: dict[str, Any] = next(c for c in report["checks"]
                                 if c["key"].get("step") == "identical requests x4")
    return found


@pytest.mark.parametrize(("args", "replica", "local", "external"), [
    # B: the first of each prompt's twins from the pool, the three after it from B's own
    # cache, which the first filled
    ([], "B", 6 * SHAREABLE, 2 * SHAREABLE),
    # native offload: A, from its own GPU cache (the stub's keeps the prompt)
    (["--sharedkv-stack=native"], "A", 8 * SHAREABLE, 0),
    # the GPU prefix cache off: on A, every twin from its own LMCache (the stub's pool)
    (["--sharedkv-stack=inprocess", "--no-sharedkv-inprocess-prefix-caching"], "A", 0,
     8 * SHAREABLE),
    # #4463's later configuration: local_cpu only (no remote), the prefix cache off
    (["--sharedkv-stack=inprocess", "--no-sharedkv-inprocess-prefix-caching",
      "--sharedkv-inprocess-remote=none"], "A", 0, 8 * SHAREABLE),
], ids=["mp", "native", "inprocess-no-prefix-caching", "inprocess-local-cpu-only"])
def test_identical_requests_in_flight_pass_clean(
        pytester: pytest.Pytester, args: list[str], replica: str, local: int,
        external: int) -> None:
    result = pytester.runpytest_subprocess(*BASE, *args)
    result.assert_outcomes(passed=1)
    cell = _cell(pytester)
    assert (cell["kind"], cell["status"], cell["passed"], cell["trials"]) == (
        "divergence", "pass", 8, 8), cell
    detail = cell["detail"]
    assert (detail["k"], detail["replica"], detail["cached"], detail["local"],
            detail["external"]) == (4, replica, 8 * SHAREABLE, local, external)
    assert detail["distinct"] == {"3k-000": 1, "3k-001": 1}  # 8 in flight: 2 prompts x 4
    result.stdout.fnmatch_lines([f"*IDENTICAL *: 4 identical requests at "
                                 f"once on replica {replica} after the prompt's KV was "
                                 "stored, for each of 2 prompts: 8/8 answers exact, each "
                                 "prompt's all equal, hits as expected"])


def test_identical_requests_that_answer_differently_fail_naming_the_request(
        pytester: pytest.Pytester) -> None:
    plant(pytester, StubFaults(twins_diverge=True))
    result = pytester.runpytest_subprocess(*BASE)
    result.assert_outcomes(failed=1)
    cell = _cell(pytester)
    assert (cell["kind"], cell["status"], cell["trials"]) == ("divergence", "fail", 8), cell
    # 4 distinct each when all 4 overlap (TWIN_WAIT_S); a loaded machine may start one late
    assert cell["passed"] < 8 and set(cell["detail"]["distinct"]) == {"3k-000", "3k-001"}
    assert all(n >= 2 for n in cell["detail"]["distinct"].values()), cell["detail"]
    result.stdout.fnmatch_lines([
        "request 3k-00*, 4 identical requests at once on replica B: * distinct answers, * of "
        "4 exact; the first wrong (request *): first divergent token 0*",
        "*IDENTICAL *: * FAIL (divergence): */8 exact; request 3k-00*"])


@pytest.mark.parametrize(("args", "ini", "message"), [
    (["--no-sharedkv-inprocess-prefix-caching"], "",
     "--no-sharedkv-inprocess-prefix-caching: only the in-process stack's replicas are "
     "launched with vLLM's prefix caching as this option sets it*--sharedkv-stack is mp; "
     "give --sharedkv-stack inprocess or drop --no-sharedkv-inprocess-prefix-caching"),
    (["--sharedkv-stack=native"], "sharedkv_inprocess_prefix_caching = false",
     "ini option sharedkv_inprocess_prefix_caching: only the in-process stack*native*"),
])
def test_prefix_caching_off_on_another_stack_is_a_usage_error(
        pytester: pytest.Pytester, args: list[str], ini: str, message: str) -> None:
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_prefix_caching_off_launches_and_records_it(tmp_path: Path) -> None:
    spec = stack_launch.stacked_spec(spec_for(tmp_path, ATTENTION), "inprocess",
                                     cases({"3k": (4, 3009)}), 8,
                                     stack_launch.InprocessTiers(prefix_caching=False))
    assert spec.stack is not None
    assert spec.stack.record["prefix_caching"] is False
    argv = spec.stack.replica_argv(["vllm", "--enable-prefix-caching"], [])
    assert argv[-1] == "--no-enable-prefix-caching"  # after the launch's own: it wins
    build_vllm_pair(spec, [])  # builds argv and environment: nothing starts
    on = stack_launch.stacked_spec(spec_for(tmp_path / "on", ATTENTION), "inprocess",
                                   cases({"3k": (4, 3009)}), 8)
    assert on.stack is not None and on.stack.record["prefix_caching"] is True
    assert "--no-enable-prefix-caching" not in on.stack.flags


def test_4463s_configuration_passes_the_tier_and_says_its_gate_is_unproven(
        pytester: pytest.Pytester) -> None:
    """The whole tier on the stub's model of #4463's later configuration (each replica's
    own LMCache, no remote, the prefix cache off): every step judged by its own table
    (nothing crosses; every hit LMCache's), the gate unproven for the reason the record
    gives."""
    result = pytester.runpytest_subprocess(
        *BASE[:-2], "-k", "chain or account or identical or session or gate",
        "--sharedkv-stack=inprocess", "--sharedkv-inprocess-remote=none",
        "--no-sharedkv-inprocess-prefix-caching")
    result.assert_outcomes(passed=CHAINS + 1 + 2 + 8, skipped=1)
    report = json.loads((pytester.path / "r.json").read_text())
    steps = {c["key"]["step"]: (c["status"], c["detail"]["cached"], c["detail"]["local"],
                                c["detail"]["external"])
             for c in report["checks"] if c["key"].get("size") == "3k"
             and c["key"]["step"] in ("cold", "local", "cross", "receiver-local")}
    per_group = CHAINS * SHAREABLE
    assert steps == {"cold": ("pass", 0, 0, 0), "local": ("pass", per_group, 0, per_group),
                     "cross": ("pass", 0, 0, 0),
                     "receiver-local": ("pass", per_group, 0, per_group)}
    gate = next(c for c in report["checks"] if c["kind"] == "gate")
    assert (gate["status"], gate["detail"]["status"]) == ("unproven", "unproven"), gate
    facts = {f["name"]: json.loads(f["value"]) for f in report["facts"]
             if f["name"] in ("stack", "launch")}
    assert (facts["stack"]["remote_url"], facts["stack"]["prefix_caching"]) == (None, False)


def test_with_the_prefix_cache_off_a_local_hit_fails() -> None:
    """The table's own failure: a hit in vLLM's own prefix cache where it is off (the flag
    not applied) fails each step that may hit, naming why; LMCache's hits pass."""
    off = expected_hits("inprocess", prefix_caching=False)
    for name, replica in (("local", "A"), ("cross", "B"), ("receiver-local", "B")):
        clean = StepTotals("3k", name, replica, 1, 0, SHAREABLE, 0, 0, 0.0, SHAREABLE)
        assert totals_problems(clean, SHAREABLE, False, off.totals(name)) == []
        stray = StepTotals("3k", name, replica, 1, SHAREABLE, 0, 0, 0, 0.0, SHAREABLE)
        said = [str(p) for p in totals_problems(stray, SHAREABLE, False, off.totals(name))]
        assert f"3k {name} on {replica}: {SHAREABLE} tokens hit replica {replica}'s own " \
            "prefix cache with vLLM's prefix caching off (--no-enable-prefix-caching)" in said
    alone = expected_hits("inprocess", prefix_caching=False, remote=False)
    assert not alone.shared and alone.twins.step.replica == "A"
    problem = hit_problem(CASE, step("cross"), Answer(CASE.id, "cross", "B",
                                                      cached_tokens=SHAREABLE),
                          expect=alone.step(step("cross")))
    assert problem is not None and problem.kind == "hits"  # no remote: KV from nowhere
    with pytest.raises(KeyError):
        expected_hits("native", prefix_caching=False)  # no stack but inprocess runs so
