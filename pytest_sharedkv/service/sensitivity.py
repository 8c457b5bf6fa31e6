"""The service tier's negative control: proof, in every launched run, that the served model
sees corrupted KV. Without it an exact answer after a pool hit proves nothing.

Control requests answer cold on A; then, while the control file tells the LMCache server's
hook (``replicas/corrupt_hook.py``) to zero one chunk of every retrieve, B answers them
from the pool. The answers that copy from the zeroed chunk must change and the others must
not. If the hook never ran, or an answer that copies from the zeroed chunk stayed exact,
the gate is VOID, with the reason (the gate serves a copy model, which answers wrong from a
lost chunk by construction: an exact one means the zeroed bytes did not reach it); if such
an answer stayed exact and answers from intact chunks changed as well, the pool corrupted
the controls on its own and the gate is CONFOUNDED (the fault under test can undo or mask
the gate's corruption). If every copying answer changed but not every other stayed exact,
the gate is VOID too: the stack answers wrong without the fault, so the changed answers
prove nothing (LMCache #4463's in-process connector on the H200: 4/4 and 0/4).
Either way an exact answer of the tier proves nothing; a wrong one is still a divergence
(A answered the same prompt right cold). With external endpoints nothing can be injected:
sensitivity is unproven, and the report says so.

On vLLM's native offload the replicas share nothing: B's own CPU tier serves the gated
step instead (``expected_hits.GateSteps``: B answers the controls once, other prompts push
them off B's GPU cache, B answers them again while ``engine_hooks/native_gate_hook.py``
zeroes the named chunk's GPU blocks as B's CPU-tier load lands; ``simple_gate_hook.py`` on
the SimpleCPUOffloadConnector, the connector the launch record names). Judged as on the
other stacks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_sharedkv.service.runner import Runner
from pytest_sharedkv.stack.steps import step

PROVEN, VOID, UNPROVEN, CONFOUNDED = "proven", "VOID", "unproven", "CONFOUNDED"
GATE_OFF = ("sensitivity unproven: the gate was not run (--no-sharedkv-gate): no hook zeroed "
            "a chunk in B's loads, so nothing shows that this run's answers would change "
            "with corrupted KV")


def record_status(status: str) -> str:
    """The gate record's status (records.STATUSES) for a gate STATUS."""
    return {PROVEN: "pass", VOID: "void", UNPROVEN: "unproven", CONFOUNDED: "confounded"}[status]


@dataclass
class GateResult:
    status: str
    message: str
    zeroed_chunk: int | None = None
    copying: int = 0  # control requests that copy from the zeroed chunk
    changed: int = 0  # ... whose answer changed (must be all)
    others: int = 0  # control requests that copy from other chunks
    others_exact: int = 0  # ... whose answer stayed exact (should be all)
    zeroed_chunks_logged: int = 0
    hook_loaded: bool | None = None  # the server's hook recorded that it loaded (None: unknown)
    wrapped: list[str] | None = None  # the functions the hook wrapped (None: not recorded)
    evict_failed: str | None = None  # why the push off B's GPU cache may not have taken
    details: list[dict[str, Any]] = field(default_factory=list)

    @property
    def void(self) -> bool:
        """Exact answers of this pair prove nothing (VOID or CONFOUNDED)."""
        return self.status in (VOID, CONFOUNDED)


def evictor_passes(gpu_tokens: int, pass_tokens: int) -> int:
    """Passes over the controls (each under namespaces of its own) that allocate at least
    GPU_TOKENS of new KV, and one more: vLLM reuses its free blocks oldest first, so every
    block the controls left on the GPU is then gone (still in the CPU tier)."""
    if gpu_tokens <= 0 or pass_tokens <= 0:
        return 0
    return -(-gpu_tokens // pass_tokens) + 1


@dataclass
class Evicted:
    """What the push off a replica's GPU cache sent, and the errors of those that got no
    answer (a push that failed leaves the prompts where the next step may hit them)."""

    sent: int = 0
    errors: list[str] = field(default_factory=list)

    def failed(self) -> str | None:
        """Why the push may not have taken, or None."""
        if not self.errors:
            return None
        return (f"{len(self.errors)} of {self.sent} requests that were to push the prompts "
                f"off the GPU cache got no answer (first: {self.errors[0]})")


def evict(runner: Runner, replica: str, controls: list[Any], stack: Mapping[str, Any],
          group: str = "gate") -> Evicted:
    """Push the controls off REPLICA's GPU cache with their own prompts under other
    namespaces (the record's ``gpu_blocks`` of ``block_size`` tokens, the corpus's chunk
    where the record gives no block size); the requests sent, tagged and logged as GROUP's
    (the gate's, or the block-boundary stage's). Their salts keep to
    ``namespaces.UNSAFE_SALT``'s characters (no "/": the stub, as LMCache, refuses one)."""
    from pytest_sharedkv.corpus.cases import prompt_size
    from pytest_sharedkv.processes.thread_pool import map_concurrently

    block = int(stack.get("block_size") or runner.cases.chunk or 0)
    gpu_tokens = int(stack.get("gpu_blocks") or 0) * block
    passes = evictor_passes(gpu_tokens, sum(prompt_size(c.prompt_tokens, c.text)
                                            for c in controls))
    sends = [(c, p) for p in range(passes) for c in controls]
    answers = map_concurrently(
        lambda cp: runner.send(replica, cp[0].id, f"{group}-evict-{cp[1]}", cp[0].text,
                               f"{runner.salt(cp[0].id)}.evict-{cp[1]}"), sends,
        runner.concurrency)
    evicted = Evicted(len(sends), [a.error for a in answers if a.error])
    runner.log(f"{group}: {len(sends)} requests on {replica} pushed the prompts off its GPU "
               f"cache ({gpu_tokens} tokens)"
               + (f"; {evicted.failed()}" if evicted.errors else ""))
    return evicted


def run_gate(runner: Runner, control: Path | None, log: Path | None,
             stack: Mapping[str, Any] | None = None) -> GateResult:
    """STACK: the launch record's stack (None: the MP server's); one whose record says
    "gate": "none" is unproven for the reason it records ("no_gate"). The steps are the
    stack's (``expected_hits.GateSteps``)."""
    from pytest_sharedkv.engine_hooks.corrupt_hook import read_log
    from pytest_sharedkv.service.checks import diverged
    from pytest_sharedkv.service.expected_hits import expected_hits, stack_of

    cases = runner.cases
    controls = cases.by_role("control")
    if control is None and stack is not None and stack.get("gate") == "none":
        return GateResult(UNPROVEN, f"sensitivity unproven: {stack.get('no_gate')}")
    if control is None:
        return GateResult(UNPROVEN, "sensitivity unproven: the replicas are external "
                          "endpoints, so no corruption can be injected; exact answers from "
                          "them prove integrity only as far as the served model can see "
                          "corrupted KV")
    if not controls or cases.zeroed_chunk is None:
        return GateResult(UNPROVEN, "sensitivity unproven: this corpus has no control "
                          "requests")
    zeroed = cases.zeroed_chunk
    kind = stack_of(stack)
    steps = expected_hits(kind).gate
    gated = step(steps.gated)
    runner.step("gate", step(steps.reference), controls)
    for name in steps.fill:
        runner.step("gate", step(name), controls)
    pushed = Evicted()
    if steps.evict:
        time.sleep(runner.settle_for(controls))  # the fill's stores land first
        pushed = evict(runner, gated.replica, controls, stack or {})
    time.sleep(runner.settle_for(controls))
    control.write_text(json.dumps({"zero_chunks": [zeroed]}))
    try:
        runner.step("gate", gated, controls)
    finally:
        control.unlink(missing_ok=True)
    logged = [row for row in (read_log(log) if log is not None else []) if row[1] == zeroed]
    from pytest_sharedkv.engine_hooks.corrupt_hook import armed_path, read_wrapped

    result = GateResult("", "", zeroed, zeroed_chunks_logged=len(logged),
                        hook_loaded=armed_path(log).exists() if log is not None else None,
                        wrapped=read_wrapped(log) if log is not None else None,
                        evict_failed=pushed.failed())
    broken = []
    for case in controls:
        cold = runner.run.answer(case.id, steps.reference)
        cross = runner.run.answer(case.id, gated.name)
        if cold is None or cross is None or cold.error or cross.error:
            broken.append(case.id)
            result.details.append({"case": case.id, "expected": list(case.expected or ()),
                                   "cold": cold.to_data() if cold else None,
                                   gated.name: cross.to_data() if cross else None})
            continue
        # against the answer by construction (copy corpus) or A's cold answer (text corpus)
        right_cold = diverged(runner.run, case, cold) is None
        changed = diverged(runner.run, case, cross) is not None
        if not right_cold:
            broken.append(case.id)
        if case.source_chunk == zeroed:
            result.copying += 1
            result.changed += changed
        else:
            result.others += 1
            result.others_exact += not changed
        result.details.append({"case": case.id, "source_chunk": case.source_chunk,
                               "cold_exact": right_cold, "changed": changed,
                               "expected": list(case.expected or ()),
                               "cold": cold.to_data(), gated.name: cross.to_data()})
    return judge(result, broken, copy_model=runner.cases.kind == "copy", stack=kind,
                 connector=str((stack or {}).get("connector") or "") or None)


def native_needed(connector: str | None) -> tuple[str, ...]:
    """What the native gate's hook for CONNECTOR (the launch record's) must wrap:
    ``simple_gate_hook``'s for the SimpleCPUOffloadConnector, else ``native_gate_hook``'s."""
    from pytest_sharedkv.engine_hooks import native_gate_hook, simple_gate_hook

    if connector == simple_gate_hook.CONNECTOR:
        return simple_gate_hook.NEEDED
    return native_gate_hook.NEEDED


def _native_wrapped_words(wrapped: list[str] | None, connector: str | None = None) -> str:
    """Why the native hook zeroed nothing, from what it wrapped: it needs every one of its
    targets (the CPU -> GPU copy, and what gives the KV-cache groups and, on the simple
    connector, each loaded request's blocks)."""
    needed = native_needed(connector)
    if wrapped is None:
        return "what it wrapped in vLLM is not known (the hook did not record it)"
    missing = [name for name in needed if name not in wrapped]
    if len(missing) == len(needed):
        return (f"it found none of its targets ({', '.join(needed)}): this vLLM keeps "
                "its CPU-offload load elsewhere")
    if missing:
        return (f"it wrapped {', '.join(wrapped)} but found no {', '.join(missing)}, "
                "which it needs too: this vLLM moved part of its CPU offload")
    return (f"it wrapped {', '.join(wrapped)}, and replica B never loaded a block of the "
            "zeroed chunk from its CPU tier (the controls stayed on its GPU cache, or the "
            "hook disabled itself: replica B's log says which)")


def _wrapped_words(wrapped: list[str] | None) -> str:
    from pytest_sharedkv.engine_hooks.corrupt_hook import TARGETS

    targets = ", ".join(f"{m}:{f}" for m, fs in TARGETS.items() for f in fs)
    if wrapped is None:  # a stub or an older hook: what it wrapped is not known
        return ("the wrapped entry point (corrupt_hook.TARGETS) is not what this LMCache "
                "version calls")
    if not wrapped:
        return (f"it found none of its targets ({targets}): this LMCache keeps the server's "
                "object-group transfer elsewhere")
    return (f"it wrapped {', '.join(wrapped)}, which the server never called for a "
            "retrieve of the zeroed chunk")


def judge(result: GateResult, broken: list[str], copy_model: bool = True,
          stack: str | None = None, connector: str | None = None) -> GateResult:
    """RESULT's status and message from its counts: VOID when a control broke cold, the hook
    never fired, an answer copying from the zeroed chunk stayed exact with every other
    exact, or every such answer changed but not every other stayed exact (the stack answers
    wrong without the fault, so the changes prove nothing: LMCache #4463's in-process
    connector on the H200, 4/4 changed and 0/4 others exact); CONFOUNDED when an answer
    copying from the zeroed chunk stayed exact while answers from intact chunks changed;
    else PROVEN (every copying answer changed, every other exact). COPY_MODEL: the served
    model is the copy model (or its attention-only variant), which sees a lost chunk by
    construction, so an answer that stayed exact says the corruption did not reach it, not
    that the model cannot see it. STACK: the stack's name (its hook: the LMCache server's,
    or replica B's vLLM's on native offload); CONNECTOR: the native stack's connector,
    whose hook's targets a gate that zeroed nothing names."""
    from pytest_sharedkv.config.stack_choice import NATIVE

    native = stack == NATIVE
    where = f"chunk {result.zeroed_chunk} zeroed in every retrieve"
    if native:
        where = f"chunk {result.zeroed_chunk} zeroed in every load from B's CPU tier"
    process = "replica B's vLLM" if native else "the LMCache server"

    def words(wrapped: list[str] | None) -> str:
        return _native_wrapped_words(wrapped, connector) if native else _wrapped_words(wrapped)

    if broken:
        result.status, result.message = VOID, (
            f"VOID: the sensitivity gate's control requests {broken} failed before any "
            "corruption (cold answers wrong or errors): the model or engine is broken here")
    elif not result.zeroed_chunks_logged and result.hook_loaded is False:
        result.status, result.message = VOID, (
            f"VOID: the sensitivity gate's hook never loaded in {process} (it "
            "recorded no start beside its log): the launched process could not import it, "
            "so no result of this tier shows the model can see corrupted KV"
            if native else
            "VOID: the sensitivity gate's hook never loaded in the LMCache server (it "
            "recorded no start beside its log): the launched server could not import it, so "
            "no result of this tier shows the model can see corrupted KV")
    elif not result.zeroed_chunks_logged:
        result.status, result.message = VOID, (
            f"VOID: the sensitivity gate's hook never zeroed a chunk in {process} "
            f"(no log line): {words(result.wrapped)}, so no result of this tier "
            "shows the model can see corrupted KV")
    elif result.changed < result.copying and result.others_exact < result.others:
        result.status, result.message = CONFOUNDED, (
            f"CONFOUNDED: with {where}, {result.changed} of {result.copying} answers that "
            f"copy from it changed, and {result.others - result.others_exact} of "
            f"{result.others} answers from intact chunks changed too: the pool corrupts KV "
            "on its own (the fault this tier exists to find), which can also undo the gate's "
            "corruption, so the model's sensitivity is not proven and exact answers of this "
            "pair prove nothing; wrong answers are still divergences. Remedy: fix the pool "
            "(for LMCache's lazy allocator on its torch fallback: --no-l1-use-lazy) and run "
            "again; the KV audit (on by default) shows where B's bytes differ")
    elif result.changed < result.copying and not copy_model:
        result.status, result.message = VOID, (
            f"VOID: with {where}, only {result.changed} of {result.copying} answers that copy "
            "from it changed: the served model does not see a lost chunk, so exact answers "
            "prove nothing; serve a model that copies from its context (the copy model)")
    elif result.changed < result.copying:
        result.status, result.message = VOID, (
            f"VOID: with {where}, only {result.changed} of {result.copying} answers that copy "
            f"from it changed, while {result.others_exact} of {result.others} from intact "
            "chunks stayed exact: the zeroed bytes did not reach every answer that reads "
            "them. The gate serves a copy model, which answers wrong from a lost chunk by "
            "construction (its corruption matrix), so the pool or the engine lost, bypassed "
            "or overwrote the gate's corruption on its way to B; exact answers of this pair "
            "prove nothing, wrong ones are still divergences, and the KV audit (on by "
            "default) shows where B's bytes differ")
    elif result.others_exact < result.others:
        result.status, result.message = VOID, (
            f"VOID: only {result.others_exact}/{result.others} answers that do not copy "
            f"from the zeroed chunk stayed exact (with {where}; {result.changed}/"
            f"{result.copying} that copy from it changed): "
            + ("the stack answers wrong without the fault, so the gate's changed answers "
               "prove nothing. The copy model answers right from intact chunks by "
               "construction (its corruption matrix: another chunk lost leaves the answer "
               "as it was), so the pool or the engine corrupts KV on its own, or the gate's "
               "zeroing reached beyond its chunk; exact answers of this pair prove nothing, "
               "wrong ones are still divergences"
               if copy_model else
               "the stack answers wrong without the fault, or the served model's answers "
               "depend on the zeroed chunk beyond what they copy, so the gate's changed "
               "answers prove nothing; serve a model that copies from its context (the copy "
               "model), whose answers from intact chunks stay exact by construction"))
    else:
        result.status = PROVEN
        result.message = (f"sensitivity proven: with {where}, {result.changed}/"
                          f"{result.copying} answers that copy from it changed and "
                          f"{result.others_exact}/{result.others} others stayed exact")
    if result.evict_failed and result.status != PROVEN:
        result.message += f"; the push before the gated step: {result.evict_failed}"
    return result
