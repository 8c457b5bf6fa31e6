"""The service tier's identical requests one after another (LMCache #4463's later report in
its own condition: four identical greedy requests sent in sequence, four different
answers), on the stub double: one prompt cold on A, then K requests of it, each sent once
the last answered, to the replica the identical requests go to; every answer exact and all
K equal, the first one's hit as the stack's expected hits say. A planted fault (each load
of a prompt from the pool answers one of its own) fails it naming the request and how many
distinct answers came back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from tests.launch_faults import StubFaults, plant

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json", "-k", "in_sequence"]
LATER = ["--sharedkv-stack=inprocess", "--no-sharedkv-inprocess-prefix-caching",
         "--sharedkv-inprocess-remote=none"]  # #4463's later configuration
SHAREABLE = 3008


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, "4")


def _cell(pytester: pytest.Pytester) -> dict[str, Any]:
    report = json.loads((pytester.path / "r.json").read_text())
    found: dict[str, Any] = next(c for c in report["checks"] if c["key"].get("step")
                                 == "identical requests in sequence x4")
    return found


@pytest.mark.parametrize(("args", "replica", "external"), [
    ([], "B", SHAREABLE * 2),  # the first of each prompt from the pool, then B's own cache
    (LATER, "A", SHAREABLE * 8),  # the prefix cache off: every request from LMCache
], ids=["mp", "inprocess-local-cpu-only"])
def test_identical_requests_in_sequence_pass_clean(pytester: pytest.Pytester,
                                                   args: list[str], replica: str,
                                                   external: int) -> None:
    result = pytester.runpytest_subprocess(*BASE, *args)
    result.assert_outcomes(passed=1)
    cell = _cell(pytester)
    assert (cell["kind"], cell["status"], cell["passed"], cell["trials"]) == (
        "divergence", "pass", 8, 8), cell
    detail = cell["detail"]
    assert (detail["k"], detail["sequential"], detail["replica"], detail["external"]) == (
        4, True, replica, external), detail
    assert detail["distinct"] == {"3k-000": 1, "3k-001": 1}
    result.stdout.fnmatch_lines([f"*IDENTICAL *: 4 identical requests one after another on "
                                 f"replica {replica} after the prompt's KV was stored, for "
                                 "each of 2 prompts: 8/8 answers exact, each prompt's all "
                                 "equal, the first one's hit as expected"])


def test_requests_in_sequence_that_answer_differently_fail_naming_the_request(
        pytester: pytest.Pytester) -> None:
    """The later configuration with the planted fault: every request loads from LMCache,
    each answers one of its own: 4 distinct answers a prompt, none exact."""
    plant(pytester, StubFaults(sequence_diverge=True))
    result = pytester.runpytest_subprocess(*BASE, *LATER)
    result.assert_outcomes(failed=1)
    cell = _cell(pytester)
    assert (cell["kind"], cell["status"], cell["passed"], cell["trials"]) == (
        "divergence", "fail", 0, 8), cell
    assert cell["detail"]["distinct"] == {"3k-000": 4, "3k-001": 4}
    result.stdout.fnmatch_lines([
        "request 3k-000, 4 identical requests one after another on replica A: 4 distinct "
        "answers, 0 of 4 exact; the first wrong (request 1): first divergent token 0*"])


def test_requests_in_sequence_never_overlap(pytester: pytest.Pytester) -> None:
    """With the in-flight fault planted (identical requests in flight together answer
    differently, each held in flight a while), the cell in sequence still passes: each
    request is sent once the last has answered, so none overlaps another."""
    plant(pytester, StubFaults(twins_diverge=True))
    result = pytester.runpytest_subprocess(*BASE)
    result.assert_outcomes(passed=1)
    assert _cell(pytester)["detail"]["distinct"] == {"3k-000": 1, "3k-001": 1}
