"""The shipped service_regression suite, end to end, on the stub provider (a test double
that answers copy prompts with the copy model's rule): a clean pass passes; a planted
corruption, a planted leak and a planted divergence are each caught by name; a gate
whose hook never fires makes every result VOID; external endpoints say that sensitivity
is unproven."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.report.records import Bundle
from pytest_sharedkv.service import summary
from tests.golden import assert_golden
from tests.launch_faults import StubFaults, plant
from tests.process_tags import tagged
from tests.stub_endpoints import external_stubs

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k"]
# The self-tests' small plan: the first 10 of the 200 committed 3k requests (every pass
# here sent all 200, 4 steps each; test_service_corpus checks every committed payload).
CHAINS = 10
PROTOCOL_CHECKS = 15
# + the corruption matrix, the identical requests at once and in sequence
ALL = 1 + CHAINS + 1 + 8 + PROTOCOL_CHECKS + 1 + 1 + 1


@pytest.fixture(autouse=True)
def _small_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, str(CHAINS))


def _stubs_left(tag: str) -> bool:
    """A stub this test's run started is still alive (other runs' may be)."""
    return any("stub_openai" in p.cmdline for p in tagged(tag))


@pytest.mark.golden
def test_clean_pass(pytester: pytest.Pytester, process_tag: str) -> None:
    """The tier's summary as a whole is its golden file (tests/data/terminal/
    service_regression.txt: the skips, the wall-time note, the corruption matrix, the step
    table, the GATE and VERDICT lines); the records hold what it says."""
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    # skipped: no stored references to compare, the triage (nothing to triage), the fault
    # catalogue (off), the L2 fault and write-failure cells (the hosts topology's) and the
    # block boundaries (native offload's); the KV audit is on by default, in the stub as in
    # launched vLLM, and passes
    result.assert_outcomes(passed=ALL + 1, skipped=CHAINS + 5)
    assert_golden(result.stdout.str(), "service_regression")
    report = json.loads((pytester.path / "r.json").read_text())
    checks = report["checks"]
    steps = {c["key"]["step"]: c for c in checks if c["key"].get("size") == "3k"
             and c["kind"] == "hits"}
    # every 3k step exact for the 10 requests, each repeat's 3008 shareable tokens a hit:
    # A's and B's repeats in their own caches, B's cross step from the pool
    assert {step: (c["passed"], c["trials"], c["status"], c["detail"]["cached"],
                   c["detail"]["local"], c["detail"]["external"])
            for step, c in steps.items()} == {
        "local": (10, 10, "pass", 30_080, 30_080, 0),
        "cross": (10, 10, "pass", 30_080, 0, 30_080),
        "receiver-local": (10, 10, "pass", 30_080, 30_080, 0)}
    gate = next(c for c in checks if c["key"].get("size") == "gate")
    assert gate["role"] == "negative-control" and gate["detail"]["status"] == "proven"
    audit = next(c for c in report["checks"] if c["key"].get("size") == "audit")
    assert (audit["kind"], audit["status"]) == ("audit-mismatch", "pass")
    assert audit["detail"]["cost_us_per_token"] is not None  # its cost, as the report says
    assert (gate["detail"]["zeroed_chunk"], gate["detail"]["others_exact"],
            gate["detail"]["others"]) == (47, 4, 4)
    assert {(c["key"]["size"], c["status"]) for c in checks
            if c["kind"] in ("session", "protocol")} == {("session", "pass"),
                                                         ("protocol", "pass")}
    kinds = Counter(c["kind"] for c in checks)
    # the two cache_salt checks are recorded as isolation (issue 52), the rest as protocol;
    # the cold steps (warm-up and 3k) each keep an isolation record too: nothing cold hit
    assert (kinds["session"], kinds["protocol"], kinds["isolation"]) == (
        8, PROTOCOL_CHECKS - 2, 2 + 2)
    assert [c for c in checks if c["key"].get("step") == "chain"] == []  # no divergence
    # a clean pass has nothing to triage, and its skip says so (not "triage is off")
    triage = next(t for t in report["tests"] if t["nodeid"].endswith("::test_triage[stub]")
                  or "test_triage" in t["nodeid"])
    assert triage["outcome"] == "skipped" and "nothing to triage" in triage["message"], triage
    assert not _stubs_left(process_tag)


def test_planted_corruption_is_caught_and_blamed_on_the_cache(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, process_tag: str) -> None:
    plant(pytester, StubFaults(corrupt_external=True))
    result = pytester.runpytest_subprocess(*BASE, "-k", "chain and 3k-00",
                                           "--sharedkv-json=r.json")
    result.assert_outcomes(failed=10)
    chains = [c for c in json.loads((pytester.path / "r.json").read_text())["checks"]
              if c["key"].get("step") == "chain"]
    assert len(chains) == 10
    assert {(c["kind"], c["status"]) for c in chains} == {("divergence", "fail")}
    # each request's answers by step: only B's cross answer (3008 tokens from the pool)
    # differs from the constructed one, from its first token
    for chain in chains:
        answers, expected = chain["detail"]["answers"], chain["detail"]["expected"]
        assert {step: a["ids"] == expected for step, a in answers.items()} == {
            "cold": True, "local": True, "cross": False, "receiver-local": True}
        assert answers["cross"]["ids"][0] != expected[0]
        assert {step: a["cached_tokens"] for step, a in answers.items()} == {
            "cold": 0, "local": 3008, "cross": 3008, "receiver-local": 3008}
    # prose only: the zero-hit control's outcome is in the failure's words, not the record
    result.stdout.fnmatch_lines([
        "request 3k-000 *zero-hit control (same request, fresh cache_salt, replica B): right, "
        "so the fault is in cache transfer or reuse, not the model[]]",
        "(--sharedkv-triage re-runs this pair's diverging size group under controls and "
        "names the class of fault)",  # offered where the pair can be relaunched
    ])
    assert not _stubs_left(process_tag)


def test_planted_divergence_is_blamed_on_the_model(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    plant(pytester, StubFaults(diverge=True))
    result = pytester.runpytest_subprocess(*BASE, "-k", "chain and 3k-00")
    result.assert_outcomes(failed=10)
    # prose only: the zero-hit control's outcome is in the failure's words, not the record
    result.stdout.fnmatch_lines([
        "request 3k-000 *step cross on replica B*zero-hit control (same request, fresh "
        "cache_salt, replica B): wrong too, so the model or engine is at fault, not the "
        "cache[]]",
    ])


def test_planted_leak_is_caught_by_name(pytester: pytest.Pytester,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    plant(pytester, StubFaults(ignore_salt=True))
    result = pytester.runpytest_subprocess(*BASE, "-k", "protocol and cache-salt",
                                           "--sharedkv-json=r.json")
    result.assert_outcomes(failed=2)
    checks = json.loads((pytester.path / "r.json").read_text())["checks"]
    # the check's name is its key; the tokens served across namespaces only its message has
    assert {c["key"]["step"]: (c["kind"], c["status"], c["passed"], c["trials"],
                               c["message"].rsplit(": ", 1)[-1]) for c in checks} == {
        "cache-salt-separates-namespaces": ("isolation", "fail", 0, 1, "3008 cached"),
        "cache-salt-separates-namespaces-across-replicas": ("isolation", "fail", 0, 1,
                                                            "3008 cached")}


def test_a_cold_request_that_hits_is_a_namespace_leak() -> None:
    from pytest_sharedkv.corpus.cases import Case
    from pytest_sharedkv.service.answers import Answer
    from pytest_sharedkv.service.checks import hit_problem
    from pytest_sharedkv.stack.steps import STEPS

    case = Case("3k-000", "measured", "3k", "w00", "0" * 64, prompt_tokens=3009)
    cold, local = STEPS[0], STEPS[1]
    assert hit_problem(case, cold, Answer("3k-000", "cold", "A", cached_tokens=0)) is None
    leak = hit_problem(case, cold, Answer("3k-000", "cold", "A", cached_tokens=64))
    assert leak == ("isolation: the cold request hit 64 cached tokens on replica A in a "
                    "fresh cache_salt namespace (KV served across tenants)")
    assert leak is not None and leak.kind == "isolation"
    short = hit_problem(case, local, Answer("3k-000", "local", "A", cached_tokens=2976))
    assert short is not None and "2976 of the 3008 shareable" in short
    assert short.kind == "hits"
    unknown = hit_problem(case, local, Answer("3k-000", "local", "A", cached_tokens=None))
    assert unknown is not None and unknown.kind == "hits-unknown"


def test_step_totals_problems_carry_their_kind() -> None:
    from pytest_sharedkv.report.records import kinds_of, worst_kind
    from pytest_sharedkv.service.answers import StepTotals
    from pytest_sharedkv.service.checks import totals_problems

    def totals(step: str, local: int | None = 0, external: int | None = 0,
               other_external: int = 0, cached: int = 0) -> StepTotals:
        return StepTotals("3k", step, "A", 1, local, external, 0, other_external, 0.0, cached)

    assert totals_problems(totals("cold"), None) == []
    leak = totals_problems(totals("cold", local=3, other_external=2), None)
    assert kinds_of(leak) == ["isolation", "hits"]
    assert worst_kind(kinds_of(leak), "x") == "isolation"
    assert kinds_of(totals_problems(totals("local", cached=5, external=5), None)) == \
        ["hits", "hits"]
    assert kinds_of(totals_problems(totals("cross", external=None), None)) == ["hits-unknown"]


def test_a_gate_whose_hook_never_fires_makes_every_result_void(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    plant(pytester, StubFaults(no_gate=True))
    result = pytester.runpytest_subprocess(*BASE, "-k", "gate or (chain and 3k-00)",
                                           "--sharedkv-json=r.json")
    result.assert_outcomes(failed=11)
    checks = json.loads((pytester.path / "r.json").read_text())["checks"]
    gate = next(c for c in checks if c["key"].get("size") == "gate")
    assert (gate["kind"], gate["status"]) == ("gate", "void")
    # the stub's "no-gate" fault leaves the hook out altogether: nothing logged, nothing
    # wrapped, and no answer diverged, so the pair's verdict is the gate's VOID
    assert (gate["detail"]["zeroed_chunks_logged"], gate["detail"]["wrapped"]) == (0, None)
    assert gate["message"].startswith("VOID: the sensitivity gate's hook never loaded")
    assert [c for c in checks if c["key"].get("step") == "chain"] == []
    [line] = summary.verdicts(Bundle.from_data({"checks": checks}).checks)
    assert line.startswith("VERDICT stub (test double): VOID: the sensitivity gate's hook")


@pytest.fixture
def stub_endpoints(tmp_path: Path) -> Iterator[str]:
    with external_stubs("--pool", str(tmp_path / "pool")) as urls:
        yield urls


def test_external_endpoints_run_the_text_corpus_and_say_sensitivity_is_unproven(
        pytester: pytest.Pytester, stub_endpoints: str) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_sharedkv.suites", "-m", "service_regression", "-p",
        "no:cacheprovider", f"--sharedkv-endpoints={stub_endpoints}",
        "--sharedkv-settle-s=0.05", "--sharedkv-service-sizes=3k", "-k",
        "gate or chain and text-3k-00", "--sharedkv-json=r.json")
    result.assert_outcomes(passed=10, skipped=1)
    report = json.loads((pytester.path / "r.json").read_text())
    [gate] = [t for t in report["tests"] if "test_sensitivity_gate" in t["nodeid"]]
    assert gate["outcome"] == "skipped"
    assert gate["message"].startswith("sensitivity unproven: the replicas are external "
                                      "endpoints, so no corruption can be injected")
    [check] = [c for c in report["checks"] if c["key"].get("size") == "gate"]
    assert (check["kind"], check["status"], check["key"]["provider"]) == (
        "gate", "unproven", "external")
    [line] = summary.verdicts(Bundle.from_data(report).checks)
    assert line.startswith("NOTE external: sensitivity unproven")
    assert {t["outcome"] for t in report["tests"] if "test_request_chain" in t["nodeid"]} \
        == {"passed"}


def test_a_failed_scrape_makes_a_step_unknown_not_a_hit_failure(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """B's 19th metrics scrape (before the 3k group's receiver-local step: 8 in the
    warm-ups' four steps, 4 in the gate's two, 6 in the 3k cold, local and cross steps)
    fails: the step is not credited with B's cumulative pool hits (a false "came from the
    pool" failure); its record says UNKNOWN."""
    plant(pytester, StubFaults(fail_metrics=(19,)))
    result = pytester.runpytest_subprocess(*BASE, "-k", "steps_account",
                                           "--sharedkv-json=r.json")
    result.assert_outcomes(skipped=1)
    checks = json.loads((pytester.path / "r.json").read_text())["checks"]
    step = next(c for c in checks if c["key"].get("size") == "3k"
                and c["key"].get("step") == "receiver-local")
    assert (step["kind"], step["status"]) == ("hits-unknown", "unknown")
    assert step["detail"]["external"] is None and "status" not in step["detail"]
    assert step["message"] == ("3k receiver-local on B: counters could not be read on "
                               "replica B, so the step's hits are unknown")
    assert not [c for c in checks if c["message"] and c["status"] != "unknown"]


@pytest.mark.parametrize("value", ["0", "ten"])
def test_a_bad_small_plan_is_a_usage_error(pytester: pytest.Pytester,
                                           monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(MEASURED_ENV, value)
    pytester.makepyfile("import pytest\n\n@pytest.mark.service_regression\ndef test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {MEASURED_ENV}={value!r}: *"])
