"""The sensitivity gate's judgement and the verdict it leads to: an answer copying from the
zeroed chunk that stayed exact voids the pair when everything else held (the zeroed bytes
did not reach it; with a model other than the copy model, it may not see a lost chunk), but
when answers from intact chunks changed too the pool itself corrupted the controls
(CONFOUNDED, as lazy replicas on one GPU each did on the H200: 3 of 4 and 2 of 4); either
way the exact answers prove nothing while the wrong ones stand as divergences."""

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
    (4, 3, 8, [], PROVEN, "corruption reached beyond the zeroed chunk"),
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
    [line] = verdicts(_checks(CONFOUNDED, message, wrong=22))
    assert line.startswith("VERDICT lazy: 22 of 200 requests answered wrong after "
                           "cross-replica pool hits")
    assert "--no-l1-use-lazy" in line
    assert "the 178 exact answers prove nothing: CONFOUNDED" in line


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
