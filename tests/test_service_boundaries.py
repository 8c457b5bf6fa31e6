"""The service tier's block-boundary stage (vLLM #51094: the ``OffloadingConnector``
answered differently at exact offload-block boundaries), on the stub double: prompts one
short of, at and one past whole offload blocks go cold to A, are pushed off A's GPU cache
(the gate's ``evict``) and are asked again on A; every answer exact, each reload's cached
tokens whole blocks of all but its last token, from A's CPU tier. A planted fault
(a whole-block prompt loaded back answers wrong) fails the stage naming the request and
its length; other stacks skip it, saying why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.service.answers import StepTotals
from pytest_sharedkv.service.checks import totals_problems
from pytest_sharedkv.service.expected_hits import NOT_APPLICABLE, expected_hits
from pytest_sharedkv.stack.launch.native_offload import boundary_cached
from tests.launch_faults import StubFaults, plant

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json", "-k", "boundaries"]
NATIVE = ["--sharedkv-stack=native"]
LENGTHS = [1023, 1024, 1025, 2047, 2048, 2049]  # the stub's block: the corpus chunk, 32
STEP = "block boundaries of 32"


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, "2")


def _report(pytester: pytest.Pytester) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / "r.json").read_text())
    return data


def _cell(pytester: pytest.Pytester) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in _report(pytester)["checks"]
                                 if c["key"].get("step") == STEP)
    return found


def test_the_boundaries_pass_clean_on_native(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(*BASE, *NATIVE)
    result.assert_outcomes(passed=1)
    cell = _cell(pytester)
    assert (cell["kind"], cell["status"], cell["passed"], cell["trials"]) == (
        "divergence", "pass", 6, 6), cell
    detail = cell["detail"]
    assert cell["key"]["size"] == "boundary"
    assert (detail["block"], detail["blocks"], detail["replica"], detail["step"]) == (
        32, [32, 64], "A", "reload")
    assert detail["block_from"].startswith("the corpus chunk")  # the stub records none
    assert list(detail["lengths"].values()) == LENGTHS
    wanted = {f"boundary-{n}": boundary_cached(n, 32) for n in LENGTHS}
    assert detail["expected_cached"] == detail["cached_each"] == wanted
    # every hit from A's CPU tier: the eviction took the prompts off its GPU cache
    assert (detail["cached"], detail["local"], detail["external"]) == (
        sum(wanted.values()), 0, sum(wanted.values()))
    assert detail["evicting_requests"] > 0
    result.stdout.fnmatch_lines([
        "*BOUNDARY *: 1023/1024/1025/2047/2048/2049-token prompts at whole offload blocks "
        "of 32 tokens (the corpus chunk*), cold on replica A, pushed off its GPU cache, "
        "asked again: 6/6 exact, each hit whole blocks of all but its last token from its "
        "CPU tier"])


def test_a_wrong_answer_at_a_block_edge_fails_naming_the_request_and_its_length(
        pytester: pytest.Pytester) -> None:
    plant(pytester, StubFaults(boundary_diverge=True))
    result = pytester.runpytest_subprocess(*BASE, *NATIVE)
    result.assert_outcomes(failed=1)
    cell = _cell(pytester)
    assert (cell["kind"], cell["status"], cell["passed"], cell["trials"]) == (
        "divergence", "fail", 4, 6), cell
    result.stdout.fnmatch_lines([
        "request boundary-1024 (1024 tokens, exactly 32 blocks of 32), step reload on "
        "replica A: first divergent token 0: expected * (by construction), replica A "
        "answered *",
        "request boundary-2048 (2048 tokens, exactly 64 blocks of 32), step reload on "
        "replica A: first divergent token 0*",
        "*BOUNDARY *: FAIL (divergence): 4/6 exact; request boundary-1024 (1024 tokens*"])
    # the cold answers were right: only the reload at the edge went wrong
    assert "step cold" not in cell["message"]


@pytest.mark.parametrize("stack", ["mp", "inprocess"])
def test_other_stacks_skip_the_boundaries_saying_why(pytester: pytest.Pytester,
                                                     stack: str) -> None:
    result = pytester.runpytest_subprocess(*BASE, f"--sharedkv-stack={stack}")
    result.assert_outcomes(skipped=1)
    test = next(t for t in _report(pytester)["tests"]
                if "test_offload_block_boundaries" in t["nodeid"])
    assert test["message"] == NOT_APPLICABLE["boundaries"][stack]
    assert f"n/a on --sharedkv-stack {stack}" in test["message"]
    assert not [c for c in _report(pytester)["checks"] if c["key"].get("size") == "boundary"]


def test_a_reload_from_the_gpu_cache_or_short_of_whole_blocks_fails() -> None:
    """The stage's expected hits: every reload from the CPU tier, the external counter
    the cached tokens; a GPU hit (the eviction did not take) or a hit short of whole blocks
    fails naming the step; a counter that could not be read is no failure (unknown)."""
    hits = expected_hits("native").boundaries
    assert hits is not None and hits.step.replica == "A"
    full = sum(boundary_cached(n, 32) for n in LENGTHS)
    clean = StepTotals("block boundaries", "reload", "A", 6, 0, full, 0, 0, 0.0, full)
    assert totals_problems(clean, full, False, hits.hits) == []
    gpu = StepTotals("block boundaries", "reload", "A", 6, 64, full - 64, 0, 0, 0.0, full)
    said = " ".join(totals_problems(gpu, full, False, hits.hits))
    assert "64 tokens hit replica A's own prefix cache after the stage pushed these " \
        "prompts off its GPU cache" in said
    short = StepTotals("block boundaries", "reload", "A", 6, 0, full - 32, 0, 0, 0.0,
                       full - 32)
    assert f"{full - 32} of {full} shareable tokens were cached" in " ".join(
        totals_problems(short, full, False, hits.hits))
    unread = StepTotals("block boundaries", "reload", "A", 6, None, None, None, None, 0.0,
                        full, ("A",))
    assert totals_problems(unread, full, False, hits.hits) == []
    for stack in ("mp", "inprocess"):
        assert expected_hits(stack).boundaries is None

