"""service_regression tier: a fixed corpus through a replica pair; every answer checked
against the answer known by construction and against replica A's cold answer, every hit
accounted for, so a cache-induced divergence cannot pass as an HTTP 200.

Per request: cold on A (no hits: a hit is a namespace leak) -> local reuse on A -> cross-
replica on B (hits from the pool only, covering the shareable prefix) -> receiver-local on
B; on a stack whose replicas share nothing (vLLM's native offload) each step expects what
``service/expected_hits.py`` says instead. A sensitivity gate proves, in every launched
run, that the served model sees a zeroed chunk; if it does not, every result here is VOID.
Sessions alternate replicas over six turns whose answers only the distant prefix holds;
protocol checks cover what clients depend on. Stored references (syrupy) separate engine
drift from cache-induced divergence.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.markers import skip_not_asked

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.corpus.cases import Case
    from pytest_sharedkv.host.lmcache_status import LMCacheStatus
    from pytest_sharedkv.report.records import ResultSink
    from pytest_sharedkv.service.answers import ServiceRun
    from pytest_sharedkv.service.execute import Cell, Pass
    from pytest_sharedkv.stack.fixtures import PairSlot
    from pytest_sharedkv.stack.state_oracle import OracleReport

pytestmark = pytest.mark.service_regression
TIER = "service_regression"
TRIAGE_HINT = ("(--sharedkv-triage re-runs this pair's diverging size group under controls "
               "and names the class of fault)")


def _verdict(run: ServiceRun, problems: Sequence[str] = ()) -> None:
    """Fail with what went wrong. A dead replica stops the pass. A wrong answer is a
    divergence whatever the gate says (A answered the same prompt right cold); a VOID or
    CONFOUNDED gate means an exact answer proves nothing, so a pass fails and says why."""
    if run.error:
        pytest.fail(run.error, pytrace=False)
    gate = run.gate
    if problems:
        note = f"\n(sensitivity gate: {gate.message})" if gate is not None and gate.void else ""
        pytest.fail("\n".join(problems) + note, pytrace=False)
    if gate is not None and gate.void:
        pytest.fail(gate.message, pytrace=False)


def _evicted_one_host(service_pass: Pass, group: str) -> bool:
    """The one server of a shared-topology pair evicted from its L1 by the end of GROUP
    (an L1 smaller than the corpus): a cross-replica hit may then stop short of the
    shareable prefix. The hosts topology's L2 holds everything: no such allowance."""
    from pytest_sharedkv.service.checks import evicted

    runner = service_pass.runner
    return not runner.hosts and evicted(runner.evictions.get(group))


def _skip_not_applicable(check: str, service_pass: Pass, request: pytest.FixtureRequest
                         ) -> None:
    """Skip CHECK, saying why, where the pass's stack gives it nothing to judge
    (``expected_hits.NOT_APPLICABLE``: its hooks or its premise are LMCache's)."""
    from pytest_sharedkv.service.expected_hits import not_applicable

    why = not_applicable(check, service_pass.run.stack)
    if why is not None:
        skip_not_asked(request.node, why)


def _case(service_pass: Pass, case_id: str) -> Case:
    """The corpus case a test is parametrized with (a size the corpus lacks: skipped)."""
    case = service_pass.run.cases.case(case_id)
    if case is None:
        pytest.skip(f"{case_id}: not in this corpus ({service_pass.run.cases.source})")
    return case


def test_sensitivity_gate(sharedkv_service_pass: Pass, sharedkv_results: ResultSink,
                          request: pytest.FixtureRequest) -> None:
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.service.execute import GATE
    from pytest_sharedkv.service.sensitivity import PROVEN, UNPROVEN, record_status

    gate = sharedkv_service_pass.ensure(GATE).gate
    sharedkv_results.check(
        TIER, {**pair.labels, "size": "gate", "step": "zeroed chunk"},
        gate.changed, max(gate.copying, 1) if gate.status != UNPROVEN else 0,
        role="negative-control", message=gate.message, kind="gate",
        status=record_status(gate.status),
        detail={"status": gate.status, "zeroed_chunk": gate.zeroed_chunk,
                "others_exact": gate.others_exact, "others": gate.others,
                "zeroed_chunks_logged": gate.zeroed_chunks_logged, "wrapped": gate.wrapped,
                "evict_failed": gate.evict_failed, "controls": gate.details})
    if gate.status == UNPROVEN and not sharedkv_service_pass.gate:  # --no-sharedkv-gate
        skip_not_asked(request.node, gate.message)
    if gate.status == UNPROVEN:
        pytest.skip(gate.message)
    if gate.status != PROVEN:
        pytest.fail(gate.message, pytrace=False)


def test_request_chain(sharedkv_service_pass: Pass, sharedkv_service_case: str,
                       sharedkv_pair_slot: PairSlot, sharedkv_settings: Settings,
                       sharedkv_results: ResultSink) -> None:
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.report.records import kinds_of, worst_kind
    from pytest_sharedkv.service.checks import chain_failures
    from pytest_sharedkv.service.execute import GATE
    from pytest_sharedkv.service.expected_hits import not_applicable

    case = _case(sharedkv_service_pass, sharedkv_service_case)
    gated = sharedkv_service_pass.ensure(GATE)
    if gated.error:
        pytest.fail(gated.error, pytrace=False)
    run = sharedkv_service_pass.ensure(case.size)
    failures = chain_failures(run, case, _evicted_one_host(sharedkv_service_pass, case.size))
    hint: list[str] = []
    if failures:
        answers = {step: a.to_data() for (cid, step), a in run.answers.items()
                   if cid == case.id}
        sharedkv_results.check(
            TIER, {**pair.labels, "size": case.size, "step": "chain"}, 0, 1,
            message=failures[0][:600], kind=worst_kind(kinds_of(failures), "error"),
            detail={"case": case.id, "sha256": case.sha256, "answers": answers,
                    "expected": list(case.expected or ())})
        if "divergence" in kinds_of(failures) and not sharedkv_settings.triage \
                and sharedkv_pair_slot.relaunchable \
                and not_applicable("triage", run.stack) is None:
            hint.append(TRIAGE_HINT)
    _verdict(run, [*failures, *hint])


def test_steps_account_for_every_hit(sharedkv_service_pass: Pass,
                                     sharedkv_results: ResultSink) -> None:
    """One record per size x step (exact answers, the engines' hit counters, wall time);
    fails when a step's hits are not the one kind that step may have."""
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.report.records import kinds_of, worst_kind
    from pytest_sharedkv.service.checks import (
        failed_requests,
        step_problems,
        totals_problems,
        totals_unknown,
    )
    from pytest_sharedkv.service.execute import SESSIONS
    from pytest_sharedkv.service.gpu_fit import gpu_fit, judged, pool_note
    from pytest_sharedkv.service.summary import wall_line
    from pytest_sharedkv.stack.steps import STEPS

    run = sharedkv_service_pass.ensure(SESSIONS)  # every size has run
    runner = sharedkv_service_pass.runner
    steps = {s.name: s for s in STEPS}
    problems: list[str] = []
    unknown: list[str] = []
    for totals in run.totals:
        if totals.group == "gate" or totals.step not in steps:
            continue
        group = [c for c in run.cases.cases if (c.role == "measured" and c.size == totals.group)
                 or (totals.group == "warm-up" and c.role == "warmup")]
        exact = sum(not step_problems(run, c, steps[totals.step], check_hits=False)
                    for c in group)
        failed = failed_requests(run, group, totals.step)  # no answer: none to judge
        shareable = sum(c.shareable or 0 for c in group) if all(
            c.shareable is not None for c in group) else None
        # a group whose KV exceeds the replica's GPU KV cache: its own prefix cache
        # evicted it, so the pool may serve a step meant for that cache (gpu_fit)
        fit = gpu_fit(run, totals.replica, totals.group, group)
        expect = run.expect.totals(totals.step)
        found = totals_problems(totals, shareable,
                                _evicted_one_host(sharedkv_service_pass, totals.group),
                                judged(expect, fit))
        served = pool_note(totals, fit, expect)
        why_unknown = totals_unknown(totals)
        hosts: dict[str, object] = {}
        if runner.hosts and steps[totals.step].hits == "external":  # server 2's own account
            from pytest_sharedkv.service.checks import hosts_step

            split_found, split_unknown, hosts = hosts_step(
                run, runner.splits, runner.waits.get(totals.group), group, steps[totals.step])
            found += split_found
            if split_unknown and not why_unknown:
                why_unknown = "; ".join(split_unknown[:3])
        warmup = totals.group == "warm-up"  # warms the engines; judges nothing
        if not warmup:
            problems += found
            unknown += [why_unknown] if why_unknown else []
            if served is not None:  # judges nothing: the step's record carries the verdict
                sharedkv_results.note(TIER, served, kind="hits", status="info")
        kind = worst_kind(kinds_of(found), "divergence" if exact + failed < totals.requests
                          else "error" if failed else "isolation" if totals.step == "cold"
                          else "hits")
        if why_unknown and not found:
            kind = "hits-unknown"
        status = ("info" if warmup else "fail" if found or exact < totals.requests
                  else "unknown" if why_unknown else "pass")
        sharedkv_results.check(
            TIER, {**pair.labels, "size": totals.group, "step": totals.step},
            exact, totals.requests, message=("; ".join(found) or why_unknown or "")[:400],
            kind=kind, status=status,
            detail={"replica": totals.replica, "cached": totals.cached, "local": totals.local,
                    "external": totals.external, "errors": failed,
                    "other_local": totals.other_local,
                    "other_external": totals.other_external, "wall_s": round(totals.wall_s, 2),
                    "shareable": shareable, **fit.record(),
                    **({"hosts": hosts} if hosts else {}),
                    **({"evictions": runner.evictions[totals.group]}
                       if totals.group in runner.evictions else {})})
    sharedkv_results.note(TIER, wall_line(run, pair.labels))
    if runner.evictions:  # what the servers counted by the end of the pass
        from pytest_sharedkv.service.summary import evictions_line

        sharedkv_results.note(TIER, evictions_line(runner.evictions, pair.labels,
                                                   pair.record.topology_record()))
    _verdict(run, problems)  # the records above stay, so a VOID pass still shows them
    if unknown:  # neither a pass nor a hit failure: the evidence is missing
        pytest.skip("UNKNOWN: " + "; ".join(unknown))


def test_session_turns(sharedkv_service_pass: Pass, sharedkv_service_session: str,
                       sharedkv_results: ResultSink) -> None:
    """Six turns alternating replicas: each exact answer lives only in the distant prefix,
    which must have come from a cache (cached tokens beyond the source)."""
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.report.records import Problem, worst_kind
    from pytest_sharedkv.service.checks import turn_hit_problem
    from pytest_sharedkv.service.execute import SESSIONS

    run = sharedkv_service_pass.ensure(SESSIONS)
    if run.error:
        pytest.fail(run.error, pytrace=False)
    session = run.cases.session(sharedkv_service_session)
    if session is None:
        pytest.skip(f"{sharedkv_service_session}: this corpus has no sessions "
                    f"({run.cases.source})")
    answers = run.sessions.get(session.id, [])
    problems: list[Problem] = []
    for turn, answer in zip(session.turns, answers, strict=False):
        where = f"{session.id} turn {turn.index} on {turn.replica}"
        if answer.error:
            problems.append(Problem(f"{where}: {answer.error}", "error"))
        elif turn.expected is not None and answer.ids != turn.expected:
            problems.append(Problem(f"{where} (source chunk {turn.source_chunk}): answered "
                                    f"{answer.text!r}, expected by construction another "
                                    "answer", "divergence"))
        elif (hit := turn_hit_problem(run, where, turn.index, turn.replica,
                                      turn.source_chunk, answer,
                                      [t.replica for t in session.turns[:turn.index]])):
            problems.append(hit)
    if len(answers) < len(session.turns):
        problems.append(Problem(f"{session.id}: {len(answers)} of {len(session.turns)} turns "
                                "ran", "error"))
    sharedkv_results.check(
        TIER, {**pair.labels, "size": "session", "step": "6 turns"},
        len(session.turns) - len(problems), len(session.turns), message="; ".join(problems),
        kind=worst_kind((p.kind for p in problems), "session"),
        detail={"session": session.id,
                "turns": [{"cached": a.cached_tokens, "text": a.text} for a in answers]})
    _verdict(run, problems)


def _record_cell(results: ResultSink, labels: Mapping[str, str], cell: Cell, step: str,
                 failing: str, name: str, size: str = "-", limit: int | None = None
                 ) -> str | None:
    """A cell's record (its kind FAILING where it failed; at most LIMIT characters of its
    message), and why the test fails, or None."""
    kind, status = cell.judged(failing)
    message = cell.message()
    results.check(TIER, {**labels, "size": cell.size or size, "step": step}, cell.exact,
                  cell.requests, kind=kind, status=status,
                  message=message[:limit] if limit else message, detail=cell.detail)
    return cell.failure(name)


def test_identical_requests_in_flight(sharedkv_service_pass: Pass,
                                      sharedkv_results: ResultSink) -> None:
    """LMCache #4463's later report: one prompt cold on A (its KV stored), then K identical
    requests of it (the same prompt, the same cache_salt; --sharedkv-identical-requests) at
    once to one replica, B where the replicas share a pool, A on native offload. Every
    answer exact and a prompt's K answers all equal (a failure names the request and how
    many distinct answers came back), each hit as the stack's expected hits say."""
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.service.execute import IDENTICAL, IDENTICAL_GROUP

    run = sharedkv_service_pass.ensure(IDENTICAL)
    cell = run.twins
    if run.error or cell is None:
        pytest.fail(run.error or "the identical requests did not run", pytrace=False)
    failure = _record_cell(sharedkv_results, pair.labels, cell, f"{IDENTICAL_GROUP} x{cell.k}",
                           "divergence", IDENTICAL_GROUP, limit=600)
    _verdict(run, [failure] if failure is not None else [])


def test_identical_requests_in_sequence(sharedkv_service_pass: Pass,
                                       sharedkv_results: ResultSink) -> None:
    """LMCache #4463's later report in its own condition: one prompt cold on A (its KV
    stored), then K requests of it (the same prompt, the same cache_salt;
    --sharedkv-identical-requests) sent one after another to the replica the identical
    requests go to, each once the last has answered. Every answer exact and a prompt's K
    answers all equal (a failure names the request and how many distinct answers came
    back); the first request's hit as the stack's expected hits say."""
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.service.execute import SEQUENCE, SEQUENCE_GROUP

    run = sharedkv_service_pass.ensure(SEQUENCE)
    cell = run.sequence
    if run.error or cell is None:
        pytest.fail(run.error or "the identical requests in sequence did not run",
                    pytrace=False)
    failure = _record_cell(sharedkv_results, pair.labels, cell, f"{SEQUENCE_GROUP} x{cell.k}",
                           "divergence", SEQUENCE_GROUP, limit=600)
    _verdict(run, [failure] if failure is not None else [])


def test_offload_block_boundaries(sharedkv_service_pass: Pass, sharedkv_results: ResultSink,
                                  request: pytest.FixtureRequest) -> None:
    """vLLM #51094's condition on native offload: prompts one short of, at and one past
    whole offload blocks (the block said in the record), cold on A, pushed off A's GPU
    cache, then asked again on A: every answer exact, each reload's cached tokens whole
    blocks of all but its last token, from A's own CPU tier. A failure names the request
    and its length. Other stacks skip, saying why."""
    from pytest_sharedkv.service.execute import BOUNDARY, BOUNDARY_GROUP, boundary_skip

    why = boundary_skip(sharedkv_service_pass.runner)
    if why is not None:
        skip_not_asked(request.node, why)
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    run = sharedkv_service_pass.ensure(BOUNDARY)
    cell = run.boundary
    if run.error or cell is None:
        pytest.fail(run.error or "the block-boundary stage did not run", pytrace=False)
    failure = _record_cell(sharedkv_results, pair.labels, cell, f"{BOUNDARY_GROUP} of "
                           f"{cell.block}", "divergence", BOUNDARY_GROUP, size="boundary",
                           limit=600)
    _verdict(run, [failure] if failure is not None else [])


def test_protocol(sharedkv_service_pass: Pass, sharedkv_protocol_check: str,
                  sharedkv_results: ResultSink) -> None:
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.service.execute import PROTOCOL
    from pytest_sharedkv.service.protocol import ISOLATION_CHECKS

    run = sharedkv_service_pass.ensure(PROTOCOL)
    result = next((r for r in run.protocol if r.name == sharedkv_protocol_check), None)
    if result is None:
        pytest.fail(f"protocol check {sharedkv_protocol_check} did not run", pytrace=False)
    sharedkv_results.check(
        TIER, {**pair.labels, "size": "protocol", "step": result.name},
        int(result.ok), 1, message="" if result.ok else result.message,
        kind="isolation" if result.name in ISOLATION_CHECKS else "protocol",
        detail={"message": result.message})
    if not result.ok:
        pytest.fail(f"{result.name}: {result.message}", pytrace=False)


# References live in one directory per model and engine, not beside this module: syrupy
# warns that it "can not relate" such a location to the test (528 lines on an H200 run).
@pytest.mark.filterwarnings(r"ignore:\s*Can not relate snapshot:UserWarning")
def test_stored_reference(sharedkv_service_pass: Pass, sharedkv_service_case: str,
                          sharedkv_settings: Settings,
                          sharedkv_lmcache_status: LMCacheStatus | str,
                          request: pytest.FixtureRequest) -> None:
    """Replica A's cold answer (tokens, text, chosen-token logprobs) and every step's hits
    equal the stored reference for this model and engine: a difference is engine drift,
    not cache-induced divergence (the chain test judges that)."""
    import json

    from pytest_sharedkv.service import references
    pytest.importorskip("syrupy", reason="stored references are syrupy snapshots")
    pair = sharedkv_service_pass.pair
    case = _case(sharedkv_service_pass, sharedkv_service_case)
    run = sharedkv_service_pass.ensure(case.size)
    found = references.record(run, case)
    if found is None:
        pytest.fail(f"{case.id}: replica A gave no cold answer to compare", pytrace=False)
    snapshot = request.getfixturevalue("snapshot")
    root = sharedkv_settings.snapshot_dir or references.default_root()
    model = references.model_key(pair.model, run.cases.kind)
    engine = references.engine_key(pair, sharedkv_lmcache_status)
    directory = root / model / engine
    if not snapshot.session.update_snapshots and not (directory / f"{case.id}.json").exists():
        other = references.baseline(root, model, engine)
        if other is None or not (other / f"{case.id}.json").exists():
            pytest.skip(f"no stored reference for {model}/{engine} under {root}: record them "
                        "with --snapshot-update")
        stored = json.loads((other / f"{case.id}.json").read_text())
        if stored != found:
            pytest.fail(f"ENGINE DRIFT (not cache-induced): replica A's cold answer to {case.id}"
                        f" with {engine} differs from the reference recorded with {other.name}:"
                        f" stored {stored['answer']['text']!r}, now {found['answer']['text']!r}",
                        pytrace=False)
        return
    assert found == snapshot(extension_class=references.extension_for(directory), name=case.id)


@pytest.mark.sharedkv_requires("transformers", "safetensors")
def test_the_served_model_sees_corrupted_kv(sharedkv_settings: Settings,
                                            sharedkv_model_dir: Path,
                                            sharedkv_results: ResultSink) -> None:
    """The copy model's corruption matrix on CPU (transformers): a lost or foreign source
    chunk and zeroed or stale Gated DeltaNet state change its answers; 1-ulp noise,
    another chunk lost and chunks permuted within the prompt do not. Runs without a GPU,
    so any machine shows that the tier's model can see what it is meant to catch."""
    from pytest_sharedkv.corpus import copy_corpus
    from pytest_sharedkv.models import memory_matrix
    from pytest_sharedkv.models.copy_matrix import EXPECTED_CHANGE, run_matrix
    from pytest_sharedkv.models.copy_memory_model import KIND as MEMORY_KIND
    from pytest_sharedkv.models.copy_model import is_copy_model
    from pytest_sharedkv.models.kinds import kind_in
    memory = kind_in(sharedkv_model_dir) == MEMORY_KIND
    if not memory and not is_copy_model(sharedkv_model_dir):
        pytest.skip("the corruption matrix is the copy models'; a user's model is judged by "
                    "the sensitivity gate of a launched run")
    made = copy_corpus.build(32, plan=(("3k", 3000, 3, 0),), sessions=0)
    if memory:  # the memory copy model's matrix: states resumed far from any source
        rows: list[Any] = memory_matrix.run_memory_matrix(
            sharedkv_model_dir, [(r.id, [0, *made.words(r)], r.source) for r in made.measured()],
            chunk=32)
    else:
        requests = [(r.id, [0, *made.words(r)], r.source_chunk, r.source)
                    for r in made.measured()]
        rows = run_matrix(sharedkv_model_dir, requests, chunk=32)
    wrong = []
    expected = memory_matrix.EXPECTED_CHANGE if memory else EXPECTED_CHANGE
    for name, must_change in expected.items():
        group = [r for r in rows if r.corruption == name]
        held = sum(r.as_expected for r in group)
        wrong += [f"{name} on {r.request}" for r in group if not r.as_expected]
        sharedkv_results.check(
            TIER, {"provider": "copy model (transformers, cpu)", "allocator": "-",
                   "delay": "-", "size": "model", "step": name}, held, len(group),
            message="" if held == len(group) else "answers did not change as they must",
            kind="model-sensitivity",
            detail={"changed": sum(r.changed for r in group),
                    "must": "change" if must_change else "stay",
                    "min_margin_nats": round(min(r.margin for r in group), 1)})
    if wrong:
        pytest.fail("the copy model did not react as constructed: " + ", ".join(wrong),
                    pytrace=False)


def test_kv_audit(sharedkv_service_pass: Pass, sharedkv_settings: Settings,
                  sharedkv_results: ResultSink, request: pytest.FixtureRequest) -> None:
    """The in-engine KV audit (on by default; --no-sharedkv-kv-audit turns it off): every
    chunk, KV group and layer B loaded from the pool equals,
    byte for byte, what A stored (digests taken inside both engines). The sensitivity gate
    is the audit's own positive control: the chunk it zeroes must show as a mismatch in
    every control request, or the audit is VOID. Requests whose answers diverged are
    matched against the chunks the audit caught."""
    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    from pytest_sharedkv.service.checks import step_problems
    from pytest_sharedkv.service.execute import SESSIONS
    from pytest_sharedkv.stack import kv_audit
    from pytest_sharedkv.stack.steps import step as step_named

    if not sharedkv_settings.kv_audit:
        skip_not_asked(request.node, "the in-engine KV audit is off "
                       f"({sharedkv_settings.source_of('kv_audit')})")
    _skip_not_applicable("kv_audit", sharedkv_service_pass, request)
    from pytest_sharedkv.config.engine import Engine
    from pytest_sharedkv.service.references import engine_of

    if engine_of(pair) is Engine.SGLANG:  # said in the header before the run
        from pytest_sharedkv.stack.launch.sglang_dialect import KV_AUDIT

        skip_not_asked(request.node, f"{KV_AUDIT} (--sharedkv-engine sglang)")
    if pair.kv_audit_dir is None:
        pytest.skip("the KV audit runs inside replicas the suite launches (vLLM, and the "
                    "stub test double); this pair's replicas were not launched by the suite "
                    "(external endpoints), so it has none")
    run = sharedkv_service_pass.ensure(SESSIONS)
    report = kv_audit.audit(pair.kv_audit_dir)
    assert report is not None
    label = str(pair.labels.get("allocator", ""))
    cases = {c.id: c for c in run.cases.cases}
    zeroed = run.cases.zeroed_chunk
    gate_ok, faults = kv_audit.split_gate(report, cases, zeroed)
    controls = [c for c in run.cases.cases if c.role == "control" and c.source_chunk == zeroed]
    diverged = sorted(c.id for c in run.cases.cases if c.role == "measured"
                      and step_problems(run, c, step_named("cross")))
    lines = [report.summary(label), *kv_audit.correlation(faults, diverged, cases)]
    void = report.void
    if void is None and controls and run.gate is not None and run.gate.zeroed_chunks_logged:
        caught = len({m.request for m in gate_ok})  # a request's layers count once
        lines.append(f"KV AUDIT {label} positive control: the gate's zeroed chunk {zeroed} "
                     f"showed as a mismatch in {caught} of {len(run.cases.by_role('control'))}"
                     f" control requests ({len(gate_ok)} digests)")
        if caught == 0:
            void = (f"{kv_audit.VOID}: the gate zeroed chunk {zeroed} in B's retrieves and "
                    "the audit saw no mismatch there: it cannot see corrupted KV")
    oracle = _state_oracle(pair, run, sharedkv_settings)
    if oracle is not None:
        lines.append(oracle.summary(label))
    for index, line in enumerate(lines):
        sharedkv_results.note(TIER, line, kind="audit-mismatch",
                              status="void" if index == 0 and report.void else "info")
    if oracle is not None:
        sharedkv_results.check(
            TIER, {**pair.labels, "size": "audit", "step": "recurrent state"},
            oracle.exact, oracle.judged + len(oracle.unreferenced), role="check",
            kind="audit-mismatch", status=oracle.status, message=oracle.summary(label)[:600],
            detail={"judged": oracle.judged, "exact": oracle.exact,
                    "wrong": [w.line() for w in oracle.wrong[:200]],
                    "unreferenced": len(oracle.unreferenced), "mode": oracle.mode.value,
                    "control_distance": oracle.control_distance})
        if oracle.status != "pass":
            shown = [w.line() for w in oracle.wrong[:20]] or [oracle.summary(label)]
            pytest.fail("\n".join(shown), pytrace=False)
    sharedkv_results.check(
        TIER, {**pair.labels, "size": "audit", "step": "kv digests"},
        report.compared - len(faults), report.compared, role="check", kind="audit-mismatch",
        status="void" if void else "fail" if faults else "pass",
        message=(void or "; ".join(m.line() for m in faults[:3]))[:600],
        detail={**report.counts(),
                "mismatches": [m.line() for m in faults[:200]],
                "chunks_per_request": report.chunks_per_request,
                "cost_us_per_token": report.cost_us_per_token(),
                "errors": report.errors[:20], "diverged": diverged})
    isolation = None if void else report.isolation()
    if isolation is not None:  # a record of its own kind: named first by the VERDICT
        sharedkv_results.check(
            TIER, {**pair.labels, "size": "audit", "step": "salt isolation"}, 0,
            len(report.foreign), kind="isolation", status="fail", message=isolation[:600],
            detail={"foreign_loads": dict(sorted(report.foreign.items())[:200])})
    if void:
        pytest.fail(void, pytrace=False)
    if faults or isolation is not None:
        shown = [*([isolation] if isolation else []), *(m.line() for m in faults[:20])]
        more = f"\n... and {len(faults) - 20} more" if len(faults) > 20 else ""
        pytest.fail("\n".join(shown) + more, pytrace=False)


def _state_oracle(p: Any, r: ServiceRun, settings: Settings) -> OracleReport | None:
    """The state oracle over the pair's audit records (None: no recurrent-state load)."""
    from pytest_sharedkv.stack import kv_audit, state_oracle

    records = kv_audit.read_records(p.kv_audit_dir)
    served = p.record.model or settings.model  # the checkpoint the suite launched
    kind = None
    if served is not None:
        from pytest_sharedkv.models.copy_model import model_kind

        kind = model_kind(served)
    source = state_oracle.reference_source(str(p.labels.get("provider", "")), kind)
    reference = None
    if source is state_oracle.ReferenceSource.MODEL and served is not None:
        from pytest_sharedkv.corpus.choice import variant_recipe
        from pytest_sharedkv.models.copy_model import CopyModelRecipe, ids_of

        recipe = variant_recipe(served) or CopyModelRecipe()
        texts = {c.id: c for c in r.cases.cases}

        def tokens(request: str) -> list[int] | None:
            case = texts.get(request)
            return None if case is None else [0, *ids_of(case.text, recipe)]

        reference = state_oracle.reference_from_model(served, tokens)
    return state_oracle.oracle_of(records, source, reference,
                                  state_oracle.OracleMode(settings.state_oracle),
                                  kv_audit.name_of)


def test_l2_fault_gap(sharedkv_service_pass: Pass, sharedkv_pair_slot: PairSlot,
                      sharedkv_settings: Settings, sharedkv_results: ResultSink,
                      request: pytest.FixtureRequest) -> None:
    """The hosts topology's L2 fault cell: a pair whose server 2 reads the L2 through
    LMCache's fault_inject adapter, which fails chunk --sharedkv-l2-fault-gap of each load.
    B must serve the chunks before the gap from the L2 and recompute the rest: every
    answer exact, every hit exactly that prefix (a hit past the gap fails), server 2's
    split that many keys from the L2, and with the KV audit on, every digest A's."""
    from pytest_sharedkv.config.options import uses_l2
    from pytest_sharedkv.service.execute import gap_cell

    _skip_not_applicable("l2", sharedkv_service_pass, request)
    if not uses_l2(sharedkv_settings):
        skip_not_asked(request.node, "the L2 fault cell runs in the hosts topology "
                       "(--sharedkv-topology hosts)")
    sharedkv_service_pass.pair.record_launches(sharedkv_results)  # once a pair
    gap = sharedkv_settings.l2_fault_gap
    cell = gap_cell(sharedkv_service_pass, sharedkv_pair_slot,
                    request.getfixturevalue("sharedkv_l2"), gap)
    failure = _record_cell(sharedkv_results, sharedkv_service_pass.pair.labels, cell,
                           f"l2 fault gap {gap}", "hits", "l2 fault gap")
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def test_l2_write_failure(sharedkv_service_pass: Pass, sharedkv_pair_slot: PairSlot,
                          sharedkv_settings: Settings, sharedkv_results: ResultSink,
                          tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The hosts topology's L2 write-failure cell: the same prompts reach both replicas
    cold at once, each server writing them to a Redis (resp) at its memory limit, so some
    writes are refused; a fresh pair over that Redis then answers them on B. Every answer
    exact, no hit past what the L2 holds, and with the KV audit on, every chunk B loaded
    is what A or B stored. No write refused: VOID."""
    from pytest_sharedkv.config.options import uses_l2
    from pytest_sharedkv.service.execute import write_failure_cell
    from pytest_sharedkv.stack.l2 import redis_server

    _skip_not_applicable("l2", sharedkv_service_pass, request)
    if not uses_l2(sharedkv_settings):
        skip_not_asked(request.node, "the L2 write-failure cell runs in the hosts topology "
                       "(--sharedkv-topology hosts)")
    redis_missing = redis_server.missing()  # no redis-server, or no redis-py to talk to it
    if redis_missing is not None:
        pytest.skip(f"the L2 write-failure cell fills a Redis the suite starts: {redis_missing}")
    sharedkv_service_pass.pair.record_launches(sharedkv_results)  # once a pair
    cell = write_failure_cell(sharedkv_service_pass, sharedkv_pair_slot, tmp_path)
    failure = _record_cell(sharedkv_results, sharedkv_service_pass.pair.labels, cell,
                           "l2 write failure", "divergence", "l2 write failure")
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def test_triage(sharedkv_service_pass: Pass, sharedkv_pair_slot: PairSlot,
                sharedkv_settings: Settings, sharedkv_results: ResultSink,
                tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
                ) -> None:
    """--sharedkv-triage: a pair that answered wrong after cross-replica hits sends its
    diverging size group again under each control, a cell with the KV audit each, and the
    controls that removed the fault name its class (one record per cell, one verdict)."""
    from pytest_sharedkv.service import triage

    sharedkv_service_pass.pair.record_launches(sharedkv_results)  # once a pair
    _skip_not_applicable("triage", sharedkv_service_pass, request)
    found = triage.diagnose(sharedkv_service_pass)
    if not sharedkv_settings.triage:  # said only where there was something to triage
        skip_not_asked(request.node, "triage is off (--sharedkv-triage re-runs a diverging "
                       "pair under controls)" if found.group is not None or found.error
                       else found.nothing)
    if found.error:
        pytest.fail(f"nothing to triage: the pass stopped ({found.error})", pytrace=False)
    if found.group is None:
        skip_not_asked(request.node, found.nothing)
    status = (request.getfixturevalue("sharedkv_lmcache_status")  # the code remedies' path
              if sharedkv_service_pass.pair.has_server else None)
    kernel_path = None if status is None or isinstance(status, str) else status.kernel_path
    labels = sharedkv_service_pass.pair.labels

    def judged(base: triage.Base, cell: triage.Cell) -> None:  # on disk as it is judged
        triage.record_cell(sharedkv_results, labels, base, cell)
        sharedkv_results.flush()

    result = triage.triage(sharedkv_service_pass, sharedkv_pair_slot, found.group,
                           lambda name: tmp_path_factory.mktemp(f"triage-{name}"),
                           kernel_path, judged)
    triage.record_verdict(sharedkv_results, labels, result)
    line = result.verdict.line(result.base)
    if result.verdict.klass == "undecided":
        pytest.fail(line, pytrace=False)
    if result.unknown:
        pytest.fail(line + "\n" + "\n".join(f"cell {c.control.name}: {c.why_unknown or c.counts()}"
                                            for c in result.unknown), pytrace=False)


def test_fault_catalogue(sharedkv_service_pass: Pass, sharedkv_pair_slot: PairSlot,
                         sharedkv_settings: Settings, sharedkv_results: ResultSink,
                         tmp_path_factory: pytest.TempPathFactory,
                         request: pytest.FixtureRequest) -> None:
    """--sharedkv-fault-catalogue: after a pass, each fault class injected in turn on a
    slice of the corpus (a relaunched pair; one record per class as its cell is judged:
    which of the answers, the KV audit and the hit accounting caught it); a class applied
    and caught by nothing fails ("this suite cannot see <class> on this stack"), as does a
    VOID cell."""
    from pytest_sharedkv.service import catalogue
    from pytest_sharedkv.service.execute import GATE
    from pytest_sharedkv.service.triage import diverging_group

    pair = sharedkv_service_pass.pair
    pair.record_launches(sharedkv_results)  # once a pair
    _skip_not_applicable("fault_catalogue", sharedkv_service_pass, request)
    if sharedkv_settings.fault_catalogue is None:
        skip_not_asked(request.node, "the fault catalogue is off (--sharedkv-fault-catalogue "
                       "all shows which fault classes the suite can see on this stack)")
    # the pass's judgement of its answers: the gate and every size (sessions and protocol
    # checks are their own tests' and the catalogue does not wait for them)
    run = sharedkv_service_pass.ensure([GATE, *sharedkv_service_pass.run.cases.sizes()][-1])
    if run.error:
        pytest.fail(f"no fault catalogue: the pass stopped ({run.error})", pytrace=False)
    gate = run.gate
    if diverging_group(run) is not None or (gate is not None and gate.void):
        skip_not_asked(request.node, "no fault catalogue: it measures the suite's sight on a "
                       "pair that passed, and this one answered wrong or its gate proves "
                       "nothing (the triage names its fault)")
    plan = catalogue.Plan(sharedkv_service_pass, sharedkv_pair_slot,
                          lambda name: tmp_path_factory.mktemp(f"catalogue-{name}"),
                          sharedkv_settings.inject_delay or sharedkv_settings.delay_cycles,
                          sharedkv_settings.settle_for(1))
    # each cell recorded, and handed to the run, the moment it is judged
    found = catalogue.run(plan, catalogue.chosen(sharedkv_settings.fault_catalogue),
                          catalogue.Recorder(sharedkv_results, pair.labels))
    if found.void is not None:  # every class n/a: a catalogue of nothing is no PASS
        catalogue.record_void(sharedkv_results, pair.labels, found)
        pytest.fail(found.void, pytrace=False)
    if found.failures:
        pytest.fail("\n".join(c.verdict() for c in found.failures), pytrace=False)
