"""The sensitivity gate's judgement and the verdict it leads to: an answer copying from the
zeroed chunk that stayed exact voids the pair when everything else held (the zeroed bytes
did not reach it; with a model other than the copy model, it may not see a lost chunk), but
when answers from intact chunks changed too the pool itself corrupted the controls
(CONFOUNDED, as lazy replicas on one GPU each did on the H200: 3 of 4 and 2 of 4); every
copying answer changed while an answer from an intact chunk changed too voids it as well
(the stack answers wrong without the fault: the in-process stack on the H200, 4/4 and
0/4); either way the exact answers prove nothing while the wrong ones stand as
divergences."""

from __future__ import annotations

import pytest

from pytest_sharedkv.report.records import Check
from pytest_sharedkv.service.sensitivity import (
    CONFOUNDED,
    PROVEN,
    VOID,
    GateResult,
    judge,
    record_status,
)
from pytest_sharedkv.service.summary import verdicts

TIER = "service_regression"
LABELS = {"provider": "vllm", "allocator": "lazy", "delay": "0"}


def _gate(changed: int, others_exact: int, logged: int = 8) -> GateResult:
    """LOGGED zeroed chunks (-1: none, and the hook never recorded that it loaded)."""
    return GateResult("", "", 47, copying=4, changed=changed, others=4,
                      others_exact=others_exact, zeroed_chunks_logged=max(logged, 0),
                      hook_loaded=logged >= 0)


@pytest.mark.parametrize(("changed", "others_exact", "logged", "broken", "status", "words"), [
    (4, 4, 8, [], PROVEN, "sensitivity proven: with chunk 47 zeroed in every retrieve, 4/4"),
    (4, 3, 8, [], VOID, "VOID: only 3/4 answers that do not copy from the zeroed chunk "
                        "stayed exact (with chunk 47 zeroed in every retrieve; 4/4 that "
                        "copy from it changed): the stack answers wrong without the fault, "
                        "so the gate's changed answers prove nothing"),
    (4, 0, 8, [], VOID, "VOID: only 0/4 answers that do not copy from the zeroed chunk "
                        "stayed exact"),
    (3, 4, 8, [], VOID, "only 3 of 4 answers that copy from it changed, while 4 of 4 from "
                        "intact chunks stayed exact: the zeroed bytes did not reach every "
                        "answer that reads them"),
    (3, 2, 8, [], CONFOUNDED, "3 of 4 answers that copy from it changed, and 2 of 4 answers "
                              "from intact chunks changed too: the pool corrupts KV"),
    (0, 0, 8, [], CONFOUNDED, "--no-l1-use-lazy"),
    (4, 4, 0, [], VOID, "hook never zeroed a chunk"),
    (4, 4, -1, [], VOID, "hook never loaded in the LMCache server"),
    (4, 4, 8, ["control-00"], VOID, "['control-00'] failed before any corruption"),
])
def test_the_gate_is_judged_from_its_counts(changed: int, others_exact: int, logged: int,
                                            broken: list[str], status: str,
                                            words: str) -> None:
    result = judge(_gate(changed, others_exact, logged), broken)
    assert result.status == status
    assert words in result.message
    assert result.void is (status != PROVEN)


def test_a_text_model_that_missed_the_zeroed_chunk_is_told_to_serve_the_copy_model() -> None:
    """Only where the served model is not the copy model can "it does not see a lost chunk"
    be the reason; the copy model's gate never names that remedy (a run of LMCache 0.5.6's
    torch fallback, lazy, on the H200 got 3 of 4 with the copy model)."""
    text = judge(_gate(3, 4), [], copy_model=False)
    copy = judge(_gate(3, 4), [])
    assert (text.status, copy.status) == (VOID, VOID)
    assert "serve a model that copies from its context (the copy model)" in text.message
    assert "serve a model" not in copy.message
    assert "the pool or the engine lost, bypassed or overwrote" in copy.message


def _checks(status: str, message: str, wrong: int) -> list[Check]:
    gate = Check(TIER, {**LABELS, "size": "gate", "step": "zeroed chunk"}, 3, 4,
                 role="negative-control", message=message, kind="gate",
                 status=record_status(status), detail={"status": status})
    cross = Check(TIER, {**LABELS, "size": "3k", "step": "cross"}, 200 - wrong, 200)
    audit = Check(TIER, {**LABELS, "size": "audit", "step": "kv digests"}, 9972, 21247)
    return [gate, cross, audit]


def test_a_confounded_gate_keeps_the_divergences_and_voids_the_exact_answers() -> None:
    message = judge(_gate(3, 2), []).message
    gate, line = verdicts(_checks(CONFOUNDED, message, wrong=22))
    assert gate == f"GATE lazy: {message} (see VERDICT)"
    assert "--no-l1-use-lazy" in gate
    assert line.startswith("VERDICT lazy: 22 of 200 requests answered wrong after "
                           "cross-replica pool hits")
    assert line.endswith("; the 178 exact answers prove nothing (GATE lazy: CONFOUNDED)")


def test_a_gate_whose_other_answers_changed_is_void_not_proven() -> None:
    """LMCache #4463's in-process connector on the H200 (vLLM 0.26.0, LMCache 0.5.6): every
    request B answered from the pool was wrong, so under the gate 4/4 copying answers
    changed and 0/4 others stayed exact. A stack that answers wrong without the fault shows
    changed answers whatever the gate does: the gate is VOID, said in a GATE line of its
    own beside the divergences, and every answer being wrong leaves no exact answer to
    void. Data decide it: the record's status, not its words."""
    gate = judge(_gate(4, 0), [])
    assert (gate.status, gate.void, record_status(gate.status)) == (VOID, True, "void")
    assert gate.message == (
        "VOID: only 0/4 answers that do not copy from the zeroed chunk stayed exact (with "
        "chunk 47 zeroed in every retrieve; 4/4 that copy from it changed): the stack "
        "answers wrong without the fault, so the gate's changed answers prove nothing. The "
        "copy model answers right from intact chunks by construction (its corruption "
        "matrix: another chunk lost leaves the answer as it was), so the pool or the engine "
        "corrupts KV on its own, or the gate's zeroing reached beyond its chunk; exact "
        "answers of this pair prove nothing, wrong ones are still divergences")
    lines = verdicts(_checks(gate.status, gate.message, wrong=200))
    assert len(lines) == 2 and lines[0] == f"GATE lazy: {gate.message} (see VERDICT)"
    assert lines[1].startswith("VERDICT lazy: 200 of 200 requests answered wrong after "
                               "cross-replica pool hits (HTTP 200, the prompt served from "
                               "the pool); suggestion")
    assert "prove nothing" not in lines[1]  # no exact answer left to void
    assert "sensitivity proven" not in "\n".join(lines)
    text = judge(_gate(4, 0), [], copy_model=False)
    assert text.status == VOID
    assert "serve a model that copies from its context (the copy model)" in text.message


def test_a_proven_gate_is_unchanged() -> None:
    """Every copying answer changed and every other stayed exact: proven, as before."""
    gate = judge(_gate(4, 4), [])
    assert (gate.status, gate.void, record_status(gate.status)) == (PROVEN, False, "pass")
    assert gate.message == ("sensitivity proven: with chunk 47 zeroed in every retrieve, "
                            "4/4 answers that copy from it changed and 4/4 others stayed "
                            "exact")
    lines = verdicts(_checks(PROVEN, gate.message, wrong=0))
    assert lines[0] == f"GATE lazy: {gate.message}"
    assert lines[1].startswith("VERDICT lazy: 200/200 requests exact in every step")


def test_a_void_gate_with_every_answer_exact_is_void() -> None:
    message = judge(_gate(3, 4), []).message
    assert message.startswith("VOID: ")  # said once in the verdict, not "VOID: VOID:"
    assert verdicts(_checks(VOID, message, wrong=0)) == [f"VERDICT lazy: {message}"]
    hook = judge(_gate(4, 4, logged=0), []).message  # 0.5.3 on the GPU host: "VOID: VOID: ..."
    [line] = verdicts(_checks(VOID, hook, wrong=0))
    assert line.startswith("VERDICT lazy: VOID: the sensitivity gate's hook never zeroed")


def test_the_audit_record_is_no_step_of_the_table() -> None:
    """The audit's digest count is no request step: it stays out of the step verdict."""
    checks = _checks(PROVEN, "sensitivity proven", wrong=0)
    lines = verdicts(checks)
    [verdict] = [v for v in lines if v.startswith("VERDICT")]
    assert verdict.startswith("VERDICT lazy: 200/200 requests exact in every step")


@pytest.mark.parametrize(("wrapped", "words"), [
    ([], "it found none of its targets (lmcache.v1.multiprocess.object_group_transfer:"
         "transfer_kv_per_object_group, lmcache.v1.multiprocess.modules."
         "lmcache_driven_transfer:transfer_kv_per_object_group): this LMCache keeps the "
         "server's object-group transfer elsewhere"),
    (["m:f"], "it wrapped m:f, which the server never called for a retrieve"),
    (None, "the wrapped entry point (corrupt_hook.TARGETS) is not what this LMCache"),
])
def test_a_gate_that_zeroed_nothing_says_what_its_hook_wrapped(
        wrapped: list[str] | None, words: str) -> None:
    gate = _gate(4, 4, logged=0)
    gate.wrapped = wrapped
    message = judge(gate, []).message
    assert message.startswith("VOID: the sensitivity gate's hook never zeroed a chunk")
    assert words in message


STUB = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json", "--sharedkv-stack=inprocess",
        "-k", "sensitivity_gate or account or (chain and 3k-000)"]


@pytest.mark.parametrize("wrong", [True, False], ids=["answers-wrong", "clean"])
def test_the_stub_stack_that_answers_wrong_voids_its_gate(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, wrong: bool) -> None:
    """End to end on the stub double's model of the in-process stack: B answering every
    pool hit wrong (``StubFaults(corrupt_external=True)``, the H200 run's #4463) changes the
    controls that do not copy from the zeroed chunk too, so the gate's record is void (its
    test fails saying why, a GATE line beside the divergences); the same stack answering
    right keeps its gate proven."""
    import json

    from pytest_sharedkv.config.options import MEASURED_ENV
    from tests.launch_faults import StubFaults, plant

    monkeypatch.setenv(MEASURED_ENV, "1")
    if wrong:
        plant(pytester, StubFaults(corrupt_external=True))
    result = pytester.runpytest_subprocess(*STUB)
    report = json.loads((pytester.path / "r.json").read_text())
    [gate] = [c for c in report["checks"] if c["kind"] == "gate"]
    outcomes = {t["nodeid"].split("::")[-1].split("[")[0]: t["outcome"]
                for t in report["tests"]}
    text = result.stdout.str()
    if not wrong:
        assert (gate["status"], gate["detail"]["others_exact"]) == ("pass", 4), gate
        assert outcomes["test_sensitivity_gate"] == "passed"
        result.stdout.fnmatch_lines([
            "*GATE stub (test double): sensitivity proven: with chunk 47 zeroed in every "
            "retrieve, 4/4 answers that copy from it changed and 4/4 others stayed exact"])
        return
    assert (gate["status"], gate["passed"], gate["trials"]) == ("void", 4, 4), gate
    assert (gate["detail"]["others_exact"], gate["detail"]["others"]) == (0, 4)
    assert gate["message"].startswith("VOID: only 0/4 answers that do not copy from the "
                                      "zeroed chunk stayed exact")
    assert outcomes["test_sensitivity_gate"] == "failed"
    assert "sensitivity proven" not in text
    result.stdout.fnmatch_lines([
        "*GATE *: VOID: only 0/4 answers that do not copy from the zeroed chunk stayed "
        "exact*the stack answers wrong without the fault*(see VERDICT)",
        "*VERDICT *: 1 of 1 requests answered wrong after cross-replica pool hits*"])
