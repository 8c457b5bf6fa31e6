"""A size group larger than a replica's GPU KV cache: its own prefix cache evicts the group
before the local step asks again, so the pool serves that step, legitimately (a GPU run:
200 prompts of 3,008 shareable tokens against 419,424 tokens of cache). The capacity comes
from the engine's start log (vLLM 0.26.0's ``GPU KV cache size`` line; the stub double
logs its own), the local and receiver-local steps are judged by it, and a note says why;
where the group fits, the pool serving those steps still fails, and where the capacity is
unknown the steps are judged as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.corpus.cases import Case, CaseSet
from pytest_sharedkv.service.answers import ServiceRun, StepTotals
from pytest_sharedkv.service.checks import totals_problems
from pytest_sharedkv.service.expected_hits import EXTERNAL, LOCAL, expected_hits, past_gpu
from pytest_sharedkv.service.gpu_fit import gpu_fit, header_line, judged, pool_note
from pytest_sharedkv.stack.faults import StubFaults
from pytest_sharedkv.stack.launch.engine_start import gpu_kv_tokens
from tests.launch_faults import plant

# as replica A's log of the GPU run holds them (vLLM 0.26.0, an attention-only model with
# --gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296)
VLLM_LINES = (
    "(EngineCore pid=2066) INFO 12-03 00:53:07 [kv_cache_utils.py:2177] GPU KV cache size: "
    "419,424 tokens\n"
    "(EngineCore pid=2066) INFO 12-03 00:53:07 [kv_cache_utils.py:2178] Maximum "
    "concurrency for 4,096 tokens per request: 102.40x\n")
BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json", "-k", "steps_account"]
CHAINS = 10  # the first 10 of the committed 3k requests: 3,009 prompt tokens each
GROUP = CHAINS * (3009 + 16)  # their KV: prompts and 16-token answers
SHAREABLE = CHAINS * 3008
GPU_BLOCKS = 200  # of the stub's 32-token blocks: 6,400 tokens, fewer than the group's


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, str(CHAINS))


def test_the_capacity_is_read_from_vllm_s_start_line() -> None:
    assert gpu_kv_tokens(VLLM_LINES) == 419_424
    assert gpu_kv_tokens("INFO ... GPU KV cache size: 23,961 tokens\n" + VLLM_LINES) \
        == 419_424  # the last start a log holds
    assert gpu_kv_tokens("INFO Maximum concurrency for 4,096 tokens per request: 1x") is None
    assert gpu_kv_tokens("") is None  # unknown, never 0


def _cases(n: int = 200, prompt: int = 3009) -> list[Case]:
    return [Case(f"3k-{i:03d}", "measured", "3k", "", "", prompt_tokens=prompt)
            for i in range(n)]


def _run(capacities: dict[str, int | None], stack: str = "mp") -> ServiceRun:
    return ServiceRun(CaseSet("copy", 32, _cases()), "pair", stack, gpu_kv_tokens=capacities)


def _totals(step: str, replica: str, local: int, external: int, cached: int,
            other: int = 0) -> StepTotals:
    return StepTotals("3k", step, replica, 200, local, external, other, 0, 20.0, cached)


def test_a_group_past_the_gpu_cache_may_be_served_by_the_pool_and_the_note_says_why() -> None:
    run, full = _run({"A": 419_424, "B": 419_424}), 601_600
    fit = gpu_fit(run, "A", "3k", _cases())
    assert (fit.group_tokens, fit.capacity, fit.exceeds) == (605_000, 419_424, True)
    assert fit.record() == {"gpu_kv_tokens": 419_424, "group_kv_tokens": 605_000,
                            "exceeds_gpu_kv": True}
    expect = run.expect.totals("local")
    assert judged(expect, fit).sources == (LOCAL, EXTERNAL)
    served = _totals("local", "A", 0, full, full)
    assert totals_problems(served, full, False, judged(expect, fit)) == []
    assert pool_note(served, fit, expect) == (
        "3k local on A: 601,600 of 601,600 cached tokens came from the pool: the group "
        "(605,000 tokens: 200 prompts and their answers) exceeds replica A's GPU KV cache "
        "(419,424 tokens, vLLM's start log), so its own prefix cache evicted them")
    mixed = _totals("local", "A", 3008, full - 3008, full)  # part from each: a pass too
    assert totals_problems(mixed, full, False, judged(expect, fit)) == []
    # every other check keeps its force
    short = _totals("local", "A", 0, full - 3008, full - 3008)
    assert [p.kind for p in totals_problems(short, full, False, judged(expect, fit))] == \
        ["hits"]
    unaccounted = _totals("local", "A", 0, full - 3008, full)  # the rest in no counter
    assert "for the other 3008" in " ".join(
        totals_problems(unaccounted, full, False, judged(expect, fit)))
    stray = _totals("local", "A", 0, full, full, other=64)  # B hit while it had no requests
    assert "replica B counted 64 local" in " ".join(
        totals_problems(stray, full, False, judged(expect, fit)))
    cold = _totals("cold", "A", 0, 64, 64)  # a hit from nowhere on a cold step still fails
    found = totals_problems(cold, None, False, judged(run.expect.totals("cold"), fit))
    assert [p.kind for p in found] == ["isolation"]
    # the cross step expected the pool anyway: nothing changes, nothing said
    cross = _totals("cross", "B", 0, full, full)
    assert judged(run.expect.totals("cross"), fit) == run.expect.totals("cross")
    assert pool_note(cross, fit, run.expect.totals("cross")) is None
    local = _totals("local", "A", full, 0, full)  # its own cache kept it after all: no note
    assert pool_note(local, fit, expect) is None


def test_a_group_that_fits_or_an_unknown_capacity_keeps_the_step_to_its_own_cache() -> None:
    full = 601_600
    served = _totals("local", "A", 0, full, full)
    cases: list[dict[str, int | None]] = [{"A": 1_677_712, "B": 1_677_712},
                                          {"A": None, "B": None}, {}]
    for capacities in cases:
        run = _run(capacities)
        fit = gpu_fit(run, "A", "3k", _cases())
        expect = judged(run.expect.totals("local"), fit)
        assert expect == run.expect.totals("local")
        assert totals_problems(served, full, False, expect) == [
            "3k local on A: 601600 tokens came from the pool where the engine's own prefix "
            "cache should have served",
            "3k local on A: the responses reported 601600 cached tokens but the engine "
            "counted no hits in its own prefix cache"]
        assert pool_note(served, fit, run.expect.totals("local")) is None
        assert fit.record()["exceeds_gpu_kv"] is (False if capacities.get("A") else None)
    # a corpus that does not know its prompts' tokens: unknown, judged as before
    unknown = gpu_fit(_run({"A": 1}), "A", "3k", _cases(prompt=None))  # type: ignore[arg-type]
    assert (unknown.group_tokens, unknown.exceeds) == (None, False)


def test_only_a_step_of_the_own_prefix_cache_alone_changes() -> None:
    for stack in ("mp", "inprocess", "native"):
        for name, hits in expected_hits(stack).steps.items():
            changed = past_gpu(hits)
            assert (changed != hits) == (hits.sources == (LOCAL,)), (stack, name)
    for hits in expected_hits("inprocess", prefix_caching=False).steps.values():
        assert past_gpu(hits) == hits  # every hit through LMCache already


def test_the_header_says_the_capacity_and_which_groups_do_not_fit() -> None:
    assert header_line(_run({"A": 419_424, "B": 419_424}), True) == (
        "GPU KV cache (vLLM's start log): replica A 419,424 tokens, replica B 419,424 "
        "tokens; the 3k group (605,000 tokens: 200 prompts and their answers) does not "
        "fit, so its local on A and receiver-local on B may be served by the pool")
    assert header_line(_run({"A": 1_677_712, "B": None}), True) == (
        "GPU KV cache (vLLM's start log): replica A 1,677,712 tokens, replica B unknown; "
        "every size group fits")
    assert header_line(_run({"A": None, "B": None}), True) == (
        "GPU KV cache: unknown (no \"GPU KV cache size\" line in the engines' start logs), "
        "so each local step expects its replica's own prefix cache alone")
    assert header_line(_run({}), False) is None  # a stub without a cache size, external
    assert header_line(_run({"A": 10, "B": 10}, "native"), True) == (
        "GPU KV cache (vLLM's start log): replica A 10 tokens, replica B 10 tokens")


def test_the_stub_logs_its_cache_as_vllm_does() -> None:
    assert StubFaults(gpu_blocks=200).argv("A", "ON", {}) == ["--gpu-blocks", "200"]
    assert StubFaults(gpu_blocks=200, gpu_kv_tokens=10).argv("B", "ON", {}) == [
        "--gpu-blocks", "200", "--gpu-kv-tokens", "10"]


def _report(pytester: pytest.Pytester) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / "r.json").read_text())
    return data


def _steps(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["key"]["step"]: c for c in report["checks"] if c["key"].get("size") == "3k"}


def test_a_group_evicted_from_a_small_gpu_cache_passes_with_a_note(
        pytester: pytest.Pytester) -> None:
    """The stub's own cache keeps 200 blocks (6,400 tokens) and says so at start: the 3k
    group's local steps come from the pool, and pass, a note saying why."""
    plant(pytester, StubFaults(gpu_blocks=GPU_BLOCKS))
    result = pytester.runpytest_subprocess(*BASE)
    result.assert_outcomes(passed=1)
    report = _report(pytester)
    steps = _steps(report)
    for step, replica in (("local", "A"), ("receiver-local", "B")):
        check = steps[step]
        assert (check["kind"], check["status"]) == ("hits", "pass"), check
        detail = check["detail"]
        assert (detail["replica"], detail["cached"], detail["local"], detail["external"]) \
            == (replica, SHAREABLE, 0, SHAREABLE)
        assert (detail["gpu_kv_tokens"], detail["group_kv_tokens"],
                detail["exceeds_gpu_kv"]) == (6_400, GROUP, True)
    notes = [n for n in report["notes"] if n["kind"] == "hits"]
    assert [(n["status"], n["text"]) for n in notes] == [
        ("info", f"3k {step} on {replica}: {SHAREABLE:,} of {SHAREABLE:,} cached tokens came "
                 f"from the pool: the group ({GROUP:,} tokens: {CHAINS} prompts and their "
                 f"answers) exceeds replica {replica}'s GPU KV cache (6,400 tokens, vLLM's "
                 "start log), so its own prefix cache evicted them")
        for step, replica in (("local", "A"), ("receiver-local", "B"))]
    facts = [json.loads(f["value"]) for f in report["facts"] if f["name"] == "gpu_kv_tokens"]
    assert facts == [{"A": 6_400, "B": 6_400}]
    result.stdout.fnmatch_lines([
        "*GPU KV cache (vLLM's start log): replica A 6,400 tokens, replica B 6,400 tokens; "
        f"the 3k group ({GROUP:,} tokens: {CHAINS} prompts and their answers) does not fit, "
        "so its local on A and receiver-local on B may be served by the pool",
        f"*3k local on A: {SHAREABLE:,} of {SHAREABLE:,} cached tokens came from the pool*"])


def test_a_group_that_fits_but_comes_from_the_pool_still_fails(
        pytester: pytest.Pytester) -> None:
    """The same cache, but a start log that says it holds far more than the group: the
    pool serving the local steps is then no eviction the capacity explains, and fails."""
    plant(pytester, StubFaults(gpu_blocks=GPU_BLOCKS, gpu_kv_tokens=10_000_000))
    result = pytester.runpytest_subprocess(*BASE)
    result.assert_outcomes(failed=1)
    report = _report(pytester)
    steps = _steps(report)
    for step in ("local", "receiver-local"):
        check = steps[step]
        assert (check["kind"], check["status"]) == ("hits", "fail"), check
        assert check["detail"]["exceeds_gpu_kv"] is False
    assert not [n for n in report["notes"] if n["kind"] == "hits"]
    result.stdout.fnmatch_lines([
        f"3k local on A: {SHAREABLE} tokens came from the pool where the engine's own "
        "prefix cache should have served",
        f"3k receiver-local on B: the responses reported {SHAREABLE} cached tokens but the "
        "engine counted no hits in its own prefix cache"])
