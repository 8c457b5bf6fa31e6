"""One pass of the service tier over a replica pair, in stages run on demand: warm-ups
and the sensitivity gate, then each size group by step (with a zero-hit control for each
of its failures), then sessions, then protocol checks.

Tests ask for the stage they read (``Pass.ensure``) and stages run in order, so results
reach pytest's reports (and the JSON report written as the run goes) size by size, and a
run stopped by a time limit keeps what it finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.corpus.cases import Case, CaseSet
from pytest_sharedkv.report.records import Problem, kinds_of, worst_kind
from pytest_sharedkv.service.answers import Answer, ServiceRun
from pytest_sharedkv.service.protocol import run_protocol
from pytest_sharedkv.service.runner import Runner, Salts
from pytest_sharedkv.service.sensitivity import GATE_OFF, UNPROVEN, GateResult, run_gate
from pytest_sharedkv.stack.launch.native_offload import ALL_BUT_LAST, STATE_ALIGNED, WHOLE_PROMPT
from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
from pytest_sharedkv.stack.pair import ReplicaPair

if TYPE_CHECKING:
    from pytest_sharedkv.stack.fixtures import PairSlot
    from pytest_sharedkv.stack.l2.backends import L2
    from pytest_sharedkv.stack.l2.log import KeySplit
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

GATE, SESSIONS, PROTOCOL = "gate", "sessions", "protocol"
IDENTICAL = "identical"  # the stage of the identical requests in flight together
SEQUENCE = "sequence"  # the stage of the identical requests one after another
IDENTICAL_K = 4  # the identical requests of each prompt (--sharedkv-identical-requests)
BOUNDARY = "boundary"  # the stage of the prompts at whole offload blocks (vLLM #51094)


class Pass:
    def __init__(self, pair: ReplicaPair, cases: CaseSet, salts: Salts, settle_s: float,
                 concurrency: int = 8, log: Callable[[str], None] | None = None,
                 store_s_per_token: float = STORE_S_PER_TOKEN,
                 identical: int = IDENTICAL_K, gate: bool = True) -> None:
        self.pair = pair
        self.gate = gate  # False: --no-sharedkv-gate, no hook launched and no gate stage
        self.runner = Runner(pair, cases, salts, settle_s, concurrency, log,
                             store_s_per_token)
        self.identical = identical
        self.stages = [GATE, *cases.sizes(), IDENTICAL, SEQUENCE,
                       *([BOUNDARY] if boundary_skip(self.runner) is None else []),
                       SESSIONS, PROTOCOL]
        self.done: set[str] = set()
        self.started = time.perf_counter()

    @property
    def run(self) -> ServiceRun:
        return self.runner.run

    def ensure(self, stage: str) -> ServiceRun:
        """Run every stage up to STAGE that has not run (unknown stage: all of them)."""
        upto = self.stages.index(stage) if stage in self.stages else len(self.stages) - 1
        for name in self.stages[:upto + 1]:
            if name not in self.done:
                self.done.add(name)
                self._stage(name)
        self.run.wall_s = time.perf_counter() - self.started
        return self.run

    def _stage(self, name: str) -> None:
        runner, cases = self.runner, self.runner.cases
        if name == GATE:
            warmups = cases.by_role("warmup")
            if warmups:
                runner.chain("warm-up", warmups)
            runner.run.gate = (run_gate(runner, self.pair.gate_control, self.pair.gate_log,
                                        self.pair.record.stack) if self.gate else
                               GateResult(UNPROVEN, GATE_OFF))
        elif name == IDENTICAL:
            runner.run.twins = identical_cell(runner, self.identical)
        elif name == SEQUENCE:
            runner.run.sequence = identical_cell(runner, self.identical, sequential=True)
        elif name == BOUNDARY:
            runner.run.boundary = boundary_cell(runner)
        elif name == SESSIONS:
            runner.sessions()
        elif name == PROTOCOL:
            runner.run.protocol = run_protocol(runner)
        else:
            group = [c for c in cases.cases if c.role == "measured" and c.size == name]
            runner.chain(name, group)
            runner.zero_hit_controls(group)



GAP_GROUP = "l2 fault gap"
GAP_CASES = 8  # the cell's requests: enough to go concurrently, few enough to be cheap


@dataclass
class Cell:
    """What a cell (the L2 fault gap, the refused writes, the identical requests) keeps:
    SIZE the group sent,
    REQUESTS and EXACT its answers, PROBLEMS what broke, UNKNOWN what could not be judged,
    DETAIL the record's evidence, ERROR why the cell could not run, VOID why it tested
    nothing; and their one judgement of it."""

    size: str | None = None
    requests: int = 0
    exact: int = 0
    problems: list[Problem] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    void: str | None = None

    def judged(self, kind_if_failed: str) -> tuple[str, str]:
        """The record's (kind, status): the worst problem's kind (KIND_IF_FAILED where
        none names one), else error or hits-unknown where it could not be judged."""
        kind = worst_kind(kinds_of(self.problems), kind_if_failed)
        if not self.problems and (self.error or self.unknown):
            kind = "error" if self.error else "hits-unknown"
        status = ("fail" if self.problems else "void" if self.void else
                  "unknown" if self.error or self.unknown else "pass")
        return kind, status

    def message(self) -> str:
        return "; ".join([*self.problems, *self.unknown][:3]) or (self.error or self.void
                                                                   or "")

    def failure(self, step: str) -> str | None:
        """What fails the test (None: it passes)."""
        if self.error:
            return f"{step}: {self.error}"
        if self.problems or self.unknown or self.void:
            return "\n".join([*self.problems, *self.unknown][:20]) or str(self.void)
        return None


@dataclass
class GapCell(Cell):
    """The L2 fault cell: server 2's L2 (LMCache's ``fault_inject`` over the session's
    L2) fails to load chunk GAP of every lookup, so B must take exactly the chunks before
    it from the L2 and recompute the rest."""

    gap: int = 0


def gap_cases(cases: CaseSet, gap: int, chunks: Callable[[Case], int]) -> list[Case]:
    """The measured requests of the smallest size whose lookups ask for more than GAP
    whole chunks (CHUNKS: a case's), so there is a chunk past the gap; at most GAP_CASES."""
    for size in cases.sizes():
        group = [c for c in cases.cases if c.role == "measured" and c.size == size]
        if group and all(chunks(c) > gap for c in group):
            return group[:GAP_CASES]
    return []


def gap_cell(service_pass: Pass, slot: PairSlot, l2: L2, gap: int) -> GapCell:
    """A pair of its own from the session's spec with server 2's adapter wrapped in
    ``fault_inject`` (gap index GAP); COLD on A, the wait for the L2, CROSS on B, then
    each request judged: its answer exact, its hit exactly the GAP chunks before the gap
    (a hit past it fails), server 2's split GAP keys from the L2, and with the KV audit
    on, no digest B loaded different from A's. A launched session pair finishes the pass
    and is released first (the cell runs alone on the GPU, as the pass did; the tests
    after it only read the pass), as the triage does."""
    import json
    from dataclasses import replace

    from pytest_sharedkv.corpus.cases import prompt_size
    from pytest_sharedkv.service.checks import diverged, gap_hit_problem, hosts_step
    from pytest_sharedkv.stack.l2.backends import fault_inject
    from pytest_sharedkv.stack.pair import ReplicaError
    from pytest_sharedkv.stack.steps import step as step_named

    cell = GapCell(gap=gap)
    runner = service_pass.runner
    reader = json.dumps(fault_inject(l2, (gap,)), sort_keys=True)

    def edit(spec: LaunchSpec) -> LaunchSpec:
        assert spec.hosts is not None
        return replace(spec, hosts=replace(spec.hosts, reader_adapter=reader,
                                           cell="fault_inject"))

    if service_pass.pair.labels.get("provider") == "vllm" and slot.live:
        service_pass.ensure(PROTOCOL)  # every stage first: later tests only read the pass
        leftovers = slot.release()
        runner.log("l2 fault gap: released the session's pair (the cell runs alone)"
                   + (f"; processes {leftovers} survived" if leftovers else ""))
    runner.log(f"l2 fault gap: starting a pair whose server 2 fails chunk {gap} of each "
               "L2 load")
    try:
        target = slot.launch(edit)
    except (ReplicaError, RuntimeError, OSError) as exc:
        cell.error = f"its pair did not start: {str(exc).splitlines()[0][:300]}"
        return cell
    try:
        mine = Runner(target, runner.cases, lambda key: runner.salts(f"l2-gap/{key}"),
                      runner.settle_s, runner.concurrency, runner.log,
                      runner.store_s_per_token)
        cases = gap_cases(runner.cases, gap,
                          lambda c: mine.chunks(prompt_size(c.prompt_tokens, c.text)))
        if not cases:
            cell.error = (f"no size of the corpus asks for more than {gap} whole chunks: "
                          "nothing lies past the gap (a smaller gap, or a larger size)")
            return cell
        cell.size, cell.requests = cases[0].size, len(cases)
        cold, cross = step_named("cold"), step_named("cross")
        mine.chain(GAP_GROUP, cases, (cold, cross))
        chunk = (target.topology.chunk if target.topology is not None else None) \
            or runner.cases.chunk or 1
        run = mine.run
        wrong_ids: list[str] = []
        for case in cases:
            answer = run.answer(case.id, cross.name)
            if answer is None or answer.error:
                cell.problems.append(Problem(
                    f"request {case.id}, step cross: "
                    f"{answer.error if answer else 'no answer was recorded'}", "error"))
                continue
            wrong = diverged(run, case, answer)
            cell.exact += wrong is None
            if wrong is not None:
                cell.problems.append(Problem(f"request {case.id}, step cross: {wrong}",
                                             "divergence"))
                wrong_ids.append(case.id)
            hit = gap_hit_problem(case, answer, gap, chunk)
            if hit is not None:
                cell.problems.append(hit)
        cached = {c.id: a.cached_tokens or 0 for c in cases
                  if (a := run.answer(c.id, cross.name)) is not None}
        split, unknown, detail = hosts_step(run, mine.splits, mine.waits.get(GAP_GROUP),
                                            cases, cross, gap=gap)
        cell.problems += split
        cell.unknown += unknown
        audit = _audit(target, cross.name, {c.id for c in cases})
        if audit.get("mismatches"):
            cell.problems.append(Problem(
                f"the KV audit: {audit['mismatches']} digest(s) B loaded differ from A's",
                "audit-mismatch"))
        cell.detail = {"gap": gap, "chunk": chunk, "prefix_tokens": gap * chunk,
                       "hosts": detail, "audit": audit,
                       "replica": cross.replica, "cached": sum(cached.values()),
                       "cached_by_request": cached, "wrong": wrong_ids,
                       "launches": list(target.launches)}
    finally:
        leftovers = target.close()
        if leftovers:
            cell.problems.append(Problem(f"processes {leftovers} survived the cell's "
                                         "teardown", "error"))
    return cell


def _audit(pair: ReplicaPair, step: str, ids: set[str]) -> dict[str, Any]:
    """The KV audit of PAIR for the requests IDS at STEP: {} where it is off or void.
    Beside the digests compared and those that differ, the loads it could not judge (no
    store of the same chunk by A), recurrent state apart: a hit that ends where A kept no
    state loads one, and the audit cannot say whether it was right. The pair is the cell's
    own, so its counts are the cell's."""
    from pytest_sharedkv.stack import kv_audit

    report = kv_audit.audit(pair.kv_audit_dir) if pair.kv_audit_dir is not None else None
    if report is None or report.void is not None:
        return {}
    return {**report.counts(),
            "mismatches": sum(m.step == step and m.request in ids
                              for m in report.mismatches),
            "unkept_state_requests": sorted(r for r in report.unkept_state if r in ids)}


IDENTICAL_GROUP = "identical requests"
SEQUENCE_GROUP = "identical requests in sequence"  # the summary reads both by the prefix


@dataclass
class TwinsCell(Cell):
    """The identical-requests cell: K requests of each prompt at once to REPLICA (SEQUENTIAL:
    one after another), and how many DISTINCT answers each prompt got (1: all equal)."""

    k: int = IDENTICAL_K
    replica: str = ""
    sequential: bool = False
    distinct: dict[str, int] = field(default_factory=dict)


def identical_cases(cases: CaseSet, prompts: int) -> list[Case]:
    """The first PROMPTS measured requests of the smallest size (the cheapest to send K
    times at once)."""
    for size in cases.sizes():
        group = [c for c in cases.cases if c.role == "measured" and c.size == size]
        if group:
            return group[:prompts]
    return []


def identical_cell(runner: Runner, k: int, sequential: bool = False) -> TwinsCell:
    """LMCache #4463's later report (four identical greedy requests, four answers): each
    prompt cold on A under a salt of its own (its KV stored), then K identical requests of
    it (the same prompt, the same salt) to the replica the stack's ``Twins`` names: at
    once, as many prompts as fill the pass's concurrency; SEQUENTIAL (the report's own
    condition), one after another, each sent once the last answered, for as many prompts.
    Every answer must be exact (as the steps judge it) and a prompt's K answers all equal.
    At once, each hit as ``Twins.hits`` says; in sequence the first request's hit is judged
    so, and the later ones' hits are recorded, not judged (the replica's own prefix cache
    may serve what the first loaded). A runner of its own over the pass's pair, so the
    pass's answers and totals stay one a case and step."""
    from pytest_sharedkv.service.checks import (
        diverged,
        hit_problem,
        totals_problems,
        totals_unknown,
    )
    from pytest_sharedkv.stack.steps import step as step_named

    twins = runner.expect.twins
    cell = TwinsCell(k=k, replica=twins.step.replica, sequential=sequential)
    group_name = SEQUENCE_GROUP if sequential else IDENTICAL_GROUP
    how = "one after another" if sequential else "at once"
    cases = identical_cases(runner.cases, max(1, runner.concurrency // k))
    if not cases:
        cell.error = "the corpus has no measured requests to send"
        return cell
    prefix = "sequence" if sequential else "identical"
    mine = Runner(runner.pair, runner.cases, lambda key: runner.salts(f"{prefix}/{key}"),
                  runner.settle_s, runner.concurrency, runner.log, runner.store_s_per_token)
    cell.size, cell.requests = cases[0].size, k * len(cases)
    mine.step(group_name, step_named("cold"), cases)  # the KV, stored by A
    for case in cases:
        cold = mine.run.answer(case.id, "cold")
        if cold is not None and cold.error:
            cell.problems.append(Problem(f"request {case.id}, step cold on replica A: "
                                         f"{cold.error}", "error"))
        elif cold is not None:  # a salt of its own: a hit came from another tenant's KV
            hit = hit_problem(case, step_named("cold"), cold,
                              expect=runner.expect.step(step_named("cold")))
            if hit is not None:
                cell.problems.append(Problem(f"request {case.id}, step cold on replica A: "
                                             f"{hit}", hit.kind))
    if twins.hits.settle:  # the twins read what the cold step stored
        time.sleep(mine.settle_for(cases, group_name))
    answers, totals = mine.identical(group_name, twins.step, cases, k, sequential)
    for case in cases:
        mine_k = answers.get(case.id, [])
        where = f"request {case.id}, {k} identical requests {how} on replica {cell.replica}"
        errors = [a.error for a in mine_k if a.error]
        if errors:
            cell.problems.append(Problem(f"{where}: {len(errors)} got no answer ({errors[0]})",
                                         "error"))
        answered = [a for a in mine_k if not a.error]
        wrong = [(i, p) for i, a in enumerate(mine_k, 1) if not a.error
                 and (p := diverged(mine.run, case, a)) is not None]
        cell.exact += len(answered) - len(wrong)
        distinct = len({(a.text, a.ids) for a in answered})
        cell.distinct[case.id] = distinct
        if wrong or distinct > 1:
            first = f"; the first wrong (request {wrong[0][0]}): {wrong[0][1]}" if wrong else ""
            cell.problems.append(Problem(
                f"{where}: {distinct} distinct answers, {len(answered) - len(wrong)} of "
                f"{len(answered)} exact{first}", "divergence"))
        for answer in answered[:1] if sequential else answered:
            hit = hit_problem(case, twins.step, answer, expect=twins.hits)
            if hit is not None:
                cell.problems.append(Problem(f"{where}: {hit}", hit.kind))
                break  # one a prompt: the first twin that missed stands for the rest
    shareable = sum(c.shareable or 0 for c in cases) * k \
        if all(c.shareable is not None for c in cases) else None
    if not sequential:  # in sequence the later requests may hit the replica's own cache
        cell.problems += totals_problems(totals, shareable, False, twins.hits)
    why = totals_unknown(totals)
    if why:
        cell.unknown.append(why)
    cell.detail = {"k": k, "sequential": sequential, "replica": totals.replica,
                   "step": twins.step.name,
                   "prompts": [c.id for c in cases], "distinct": cell.distinct,
                   "cached": totals.cached, "local": totals.local,
                   "external": totals.external, "other_local": totals.other_local,
                   "other_external": totals.other_external, "shareable": shareable,
                   "wall_s": round(totals.wall_s, 2),
                   "answers": {cid: [a.text for a in group]
                               for cid, group in answers.items()}}
    return cell


BOUNDARY_GROUP = "block boundaries"


@dataclass
class BoundaryCell(Cell):
    """The block-boundary stage: prompts one short of, at and one past whole offload
    blocks of BLOCK tokens (BLOCK_FROM: where that block was read), asked again on REPLICA
    after its GPU cache lost them."""

    block: int = 0
    block_from: str = ""
    replica: str = ""


def boundary_skip(runner: Runner) -> str | None:
    """Why the pass has no block-boundary stage, or None: the stack's (``NOT_APPLICABLE``)
    or the corpus's (the cases are the copy corpus's, answers known by construction)."""
    from pytest_sharedkv.service.expected_hits import not_applicable

    why = not_applicable("boundaries", runner.stack)
    if why is None and runner.expect.boundaries is None:
        why = f"n/a on --sharedkv-stack {runner.stack}: it has no offload block"
    if why is None and (runner.cases.kind != "copy" or not runner.cases.chunk):
        why = ("the block-boundary stage sends copy-corpus prompts, whose answers are known "
               "by construction; this run sends the text corpus (a user's model)")
    return why


def offload_block(stack: dict[str, Any] | None, chunk: int | None) -> tuple[int, str]:
    """The offload block the boundaries are taken at, and where it was read: the launch
    record's ``block_size`` (the engine's block; ``blocks_per_chunk`` 1), else the corpus
    chunk (the stub double's hit block, as ``sensitivity.evict`` reads it)."""
    block = int((stack or {}).get("block_size") or 0)
    if block:
        return block, "the launch record's block_size: the engine's, vLLM's offload block"
    return int(chunk or 0), "the corpus chunk: no block_size recorded, the stub's block"


def edge_words(tokens: int, block: int) -> str:
    """Where a TOKENS-token prompt lies against whole blocks of BLOCK tokens, in words."""
    if tokens % block == 0:
        return f"exactly {tokens // block} blocks of {block}"
    if tokens % block == 1:
        return f"one past {tokens // block} blocks of {block}"
    if tokens % block == block - 1:
        return f"one short of {tokens // block + 1} blocks of {block}"
    return f"{tokens / block:.2f} blocks of {block}"


RULE_WORDS = {
    ALL_BUT_LAST: "whole blocks of all but its last token",
    WHOLE_PROMPT: "its whole blocks: vLLM's lookup may reach the prompt's end on a model "
                  "with attention layers only",
    STATE_ALIGNED: "whole blocks of all but its last token, and none for a prompt of whole "
                   "blocks: under mamba_cache_mode align it keeps its recurrent state only "
                   "at its end, one block past where a hit may end"}


def boundary_cell(runner: Runner) -> BoundaryCell:
    """vLLM #51094's condition: the ``native_offload.boundary_cases`` (the source in the
    first chunk, so the answer needs the blocks loaded back) cold on A, settled into A's
    CPU tier, pushed off A's GPU cache by the gate's ``evict``, then asked again on A.
    Every answer exact (by construction), each reload's cached tokens
    ``boundary_cached`` of its length from A's own CPU tier (``Boundaries.hits``); a
    failure names the request and its length. A runner of its own over the pass's pair."""
    from pytest_sharedkv.service.checks import (
        diverged,
        hit_problem,
        totals_problems,
        totals_unknown,
    )
    from pytest_sharedkv.service.sensitivity import evict
    from pytest_sharedkv.stack.launch.native_offload import (
        boundary_blocks,
        boundary_cached,
        boundary_cases,
        hit_rule,
    )
    from pytest_sharedkv.stack.steps import step as step_named

    expect = runner.expect.boundaries
    assert expect is not None  # the pass has this stage only where the stack has one
    stack = dict(runner.pair.record.stack or {})
    block, block_from = offload_block(stack, runner.cases.chunk)
    cell = BoundaryCell(size="boundary", block=block, block_from=block_from,
                        replica=expect.step.replica)
    if block <= 0:
        cell.error = "no offload block: the launch record gives no block_size, the corpus no chunk"
        return cell
    counts = boundary_blocks(block, runner.cases.chunk)
    cases = boundary_cases(block, counts, int(runner.cases.chunk or 0))
    mine = Runner(runner.pair, runner.cases, lambda key: runner.salts(f"boundary/{key}"),
                  runner.settle_s, runner.concurrency, runner.log, runner.store_s_per_token)
    cell.requests = len(cases)
    cold_step = step_named("cold")
    cold_totals = mine.step(BOUNDARY_GROUP, cold_step, cases)
    time.sleep(mine.settle_for(cases, BOUNDARY_GROUP))  # A's stores reach its CPU tier
    evicted = evict(mine, expect.step.replica, cases, stack, group=BOUNDARY)
    if evicted.failed():
        cell.problems.append(Problem(f"the push off replica {expect.step.replica}'s GPU "
                                     f"cache: {evicted.failed()}", "error"))
    reload = mine.step(BOUNDARY_GROUP, expect.step, cases)

    def where(case: Case, step_name: str) -> str:
        tokens = case.prompt_tokens or 0
        return (f"request {case.id} ({tokens} tokens, {edge_words(tokens, block)}), "
                f"step {step_name} on replica {expect.step.replica}")

    rule = hit_rule(stack)
    wanted = {}
    for case in cases:
        wanted[case.id] = boundary_cached(case.prompt_tokens or 0, block, rule)
        for name, hits in ((cold_step.name, runner.expect.step(cold_step)),
                           (expect.step.name, None)):
            answer = mine.run.answer(case.id, name)
            if answer is None or answer.error:
                cell.problems.append(Problem(
                    f"{where(case, name)}: {answer.error if answer else 'no answer'}", "error"))
                continue
            wrong = diverged(mine.run, case, answer)
            if wrong is None:
                cell.exact += name == expect.step.name
            else:
                cell.problems.append(Problem(f"{where(case, name)}: {wrong}", wrong.kind))
            if hits is not None:
                hit = hit_problem(case, cold_step, answer, expect=hits)
                if hit is not None:
                    cell.problems.append(Problem(f"{where(case, name)}: {hit}", hit.kind))
            elif answer.cached_tokens is None:
                cell.unknown.append(f"{where(case, name)}: no "
                                    "usage.prompt_tokens_details.cached_tokens")
            elif answer.cached_tokens != wanted[case.id]:
                cell.problems.append(Problem(
                    f"{where(case, name)}: {answer.cached_tokens} tokens cached, a full hit "
                    f"from {expect.hits.where} is {wanted[case.id]} ("
                    + RULE_WORDS[rule] + ")", "hits"))
    for totals, shareable, hits in (
            (cold_totals, None, runner.expect.totals(cold_step.name)),
            (reload, sum(wanted.values()), expect.hits)):
        cell.problems += totals_problems(totals, shareable, False, hits)
        why = totals_unknown(totals)
        if why:
            cell.unknown.append(why)
    cell.detail = {"block": block, "block_from": block_from, "blocks": counts,
                   "mamba_cache_mode": stack.get("mamba_cache_mode"), "hit_rule": rule,
                   "replica": reload.replica, "step": expect.step.name,
                   "lengths": {c.id: c.prompt_tokens for c in cases},
                   "expected_cached": wanted,
                   "cached_each": {c.id: (a.cached_tokens if (a := mine.run.answer(
                       c.id, expect.step.name)) else None) for c in cases},
                   "evicting_requests": evicted.sent, "gpu_blocks": stack.get("gpu_blocks"),
                   "cached": reload.cached, "local": reload.local,
                   "external": reload.external, "other_local": reload.other_local,
                   "other_external": reload.other_external,
                   "shareable": sum(wanted.values()), "wall_s": round(reload.wall_s, 2),
                   "answers": {c.id: a.text for c in cases
                               if (a := mine.run.answer(c.id, expect.step.name))}}
    return cell


WRITE_GROUP = "l2 write failure"


@dataclass
class WriteCell(Cell):
    """The L2 write-failure cell: both replicas take the same prompts cold at once (each
    server writes them to the L2) into a Redis at its memory limit, so some writes are
    refused; a fresh pair over that L2 then answers them on B, every hit from the L2."""


def write_cases(cases: CaseSet, chunks: Callable[[Case], int]) -> list[Case]:
    """The measured requests of the smallest size whose lookups ask for two or more whole
    chunks (a refused write can then fall past a held one); at most GAP_CASES."""
    return gap_cases(cases, 1, chunks)


def write_failure_cell(service_pass: Pass, slot: PairSlot, work_dir: Path) -> WriteCell:
    """A Redis of its own (resp, noeviction): a probe request cold on A measures the bytes
    one chunk takes in it, and its limit is then set to half the chunks the cell's
    requests store above what it holds. A pair over it (both servers that Redis) takes the
    requests cold on A and B at once; once each salt's writes are over (every chunk in the
    L2, or each server logged the keys it could not write), that pair is closed and a
    fresh one (empty L1s) answers them on B: every answer exact, no hit past what the L2
    holds, server 2's split all from L2, and with the KV audit on, every chunk B loaded
    equal to what A or B stored (either may have written it). No write refused: VOID."""
    from dataclasses import replace

    from pytest_sharedkv.corpus.cases import prompt_size
    from pytest_sharedkv.processes.thread_pool import map_concurrently
    from pytest_sharedkv.service.checks import diverged
    from pytest_sharedkv.stack.checks.l2_transfer import wait_writes_over
    from pytest_sharedkv.stack.l2 import backends as l2_module
    from pytest_sharedkv.stack.l2 import redis_server
    from pytest_sharedkv.stack.l2.log import store_failures
    from pytest_sharedkv.stack.pair import ReplicaError
    from pytest_sharedkv.stack.steps import Step
    from pytest_sharedkv.stack.topology import L2_DEADLINE_S, POLL_S

    cell = WriteCell()
    runner = service_pass.runner
    try:
        redis = l2_module.suite_redis(work_dir, "resp", maxmemory=1 << 40)  # limited below
        redis.start()
    except l2_module.L2Unavailable as exc:
        cell.error = f"its Redis: {exc}"
        return cell
    assert isinstance(redis, l2_module.RedisL2)
    adapter = redis.adapter_json()

    def edit(spec: LaunchSpec) -> LaunchSpec:
        assert spec.hosts is not None
        return replace(spec, hosts=replace(spec.hosts, adapter=adapter, l2=redis.describe(),
                                           reader_adapter=None, cell="write-failure"))

    def launch() -> ReplicaPair | None:
        try:
            return slot.launch(edit)
        except (ReplicaError, RuntimeError, OSError) as exc:
            cell.error = f"its pair did not start: {str(exc).splitlines()[0][:300]}"
            return None

    def closed(pair: ReplicaPair) -> None:
        leftovers = pair.close()
        if leftovers:
            cell.problems.append(Problem(f"processes {leftovers} survived the cell's "
                                         "teardown", "error"))

    try:
        if service_pass.pair.labels.get("provider") == "vllm" and slot.live:
            service_pass.ensure(PROTOCOL)  # every stage first: later tests only read it
            leftovers = slot.release()
            runner.log("l2 write failure: released the session's pair (the cell runs alone)"
                       + (f"; processes {leftovers} survived" if leftovers else ""))
        first = launch()
        if first is None:
            return cell
        audits = [first.kv_audit_dir]
        try:
            mine = Runner(first, runner.cases, lambda key: runner.salts(f"l2-full/{key}"),
                          runner.settle_s, runner.concurrency, runner.log,
                          runner.store_s_per_token)
            need = {c.id: mine.chunks(prompt_size(c.prompt_tokens, c.text))
                    for c in runner.cases.cases}
            cases = write_cases(runner.cases, lambda c: need[c.id])
            if not cases:
                cell.error = "no size of the corpus asks for two whole chunks"
                return cell
            cell.size, cell.requests = cases[0].size, len(cases)
            topology = first.topology
            assert topology is not None
            # the bytes one chunk takes in this Redis: one probe request, its own salt
            probe = Runner(first, runner.cases,
                           lambda key: runner.salts(f"l2-full-probe/{key}"), runner.settle_s)
            probe.step(f"{WRITE_GROUP} probe", Step("cold", "A", "none"), cases[:1])
            probe_salt = probe.salt(cases[0].id)
            probe_wait = topology.wait_l2({probe_salt: need[cases[0].id]},
                                          prompt_size(cases[0].prompt_tokens, cases[0].text))
            keys = redis.entries(probe_salt)
            used = None if not keys else redis_server.keys_memory(redis.host, redis.port, keys)
            if not used or probe_wait.missing:
                cell.error = ("the probe could not size a chunk in the Redis: "
                              f"its keys {len(keys) if keys is not None else 'unlisted'}, "
                              f"MEMORY USAGE {used}; "
                              + ("; ".join(probe_wait.missing) or "the L2 held it"))
                return cell
            per_chunk = used // max(need[cases[0].id], 1)
            # room for three quarters: the first request's chunks and the first half of
            # the second's, in whichever order the writers store them
            headroom = per_chunk * sum(need[c.id] for c in cases) * 3 // 4
            limit = redis_server.limit_memory(redis.host, redis.port, headroom)
            runner.log(f"l2 write failure: {redis.describe()} limited to {limit} bytes "
                       f"({headroom} above its use: 3/4 of the cell's chunks at {per_chunk} "
                       "bytes each)")
            # the same prompts reach both replicas cold, at once
            steps = (Step("cold", "A", "none"), Step("cold-b", "B", "none"))
            map_concurrently(lambda s: mine.step(WRITE_GROUP, s, cases), steps, 2)
            salts = {mine.salt(c.id): need[c.id] for c in cases}

            def held_now(salt: str) -> int | None:
                found = redis.held(salt)
                return None if found is None else found.whole

            def failures(salt: str) -> tuple[int | None, ...]:
                return tuple(store_failures(s.log(), salt) for s in topology.servers)

            over = wait_writes_over(salts, held_now, failures, L2_DEADLINE_S, POLL_S)
            held: dict[str, int | None] = dict(over.held)
            if over.pending:
                cell.unknown.append(f"the L2 writes of {len(over.pending)} of {len(salts)} "
                                    f"salt(s) were not over {L2_DEADLINE_S:g} s after the "
                                    "cold steps (neither every chunk held nor a failure "
                                    "logged by each server)")
            refused = redis_server.refused_writes(redis.host, redis.port)
            failed = {s.name: sum(store_failures(s.log(), salt) for salt in salts)
                      for s in topology.servers}
        finally:
            closed(first)
        for salt in salts:  # what the L2 holds now that no writer is left: B reads this
            found = redis.held(salt)
            held[salt] = None if found is None else found.whole
        if refused is None:
            cell.unknown.append("the Redis's refused writes (INFO errorstats) could not be "
                                "read")
        cell.void = refused_void(refused)
        second = launch()  # fresh engines and servers: every hit now comes from the L2
        if second is None:
            return cell
        audits.append(second.kv_audit_dir)
        try:
            later = Runner(second, runner.cases, mine.salt, runner.settle_s,
                           runner.concurrency, runner.log, runner.store_s_per_token)
            later.run.answers.update(mine.run.answers)  # the cold answers: what B must give
            step = Step("after-failure", "B", "external")
            later.step(WRITE_GROUP, step, cases)
            chunk = (second.topology.chunk if second.topology is not None else None) \
                or runner.cases.chunk or 1
            cached: dict[str, int | None] = {}
            for case in cases:
                answer = later.run.answer(case.id, step.name)
                where = f"request {case.id}, step {step.name}"
                if answer is None or answer.error:
                    cell.problems.append(Problem(
                        f"{where}: {answer.error if answer else 'no answer was recorded'}",
                        "error"))
                    continue
                wrong = diverged(later.run, case, answer)
                cell.exact += wrong is None
                if wrong is not None:
                    cell.problems.append(Problem(f"{where}: {wrong}", "divergence"))
                cached[case.id] = answer.cached_tokens
                judged = held_hit_problem(answer, held.get(mine.salt(case.id)), chunk,
                                          later.splits.get((case.id, step.name)))
                if isinstance(judged, Problem):
                    cell.problems.append(judged)
                elif judged is not None:
                    cell.unknown.append(judged)
            audit = _either_writer_audit(audits, step.name, {c.id for c in cases})
            if audit.get("mismatches"):
                cell.problems.append(Problem(
                    f"the KV audit: {audit['mismatches']} chunk(s) B loaded equal neither "
                    f"writer's store (first: {audit['first']})", "audit-mismatch"))
            cell.detail = {"l2": redis.describe(), "limit_bytes": limit,
                           "chunk_bytes": per_chunk, "refused": refused,
                           "failed_keys": failed, "held_whole": held, "chunk": chunk,
                           "cached_by_request": cached, "audit": audit,
                           "splits": {k: v.as_dict() for (k, s), v in later.splits.items()
                                      if s == step.name},
                           "launches": list(second.launches)}
            runner.log(f"l2 write failure: {refused} write(s) refused; after it, "
                       f"{cell.exact} of {len(cases)} answers exact, cached "
                       f"{sum(v or 0 for v in cached.values())} tokens")
        finally:
            closed(second)
        return cell
    finally:
        redis.stop()


def refused_void(refused: int | None) -> str | None:
    """Why the write-failure cell tested nothing: the Redis refused no write."""
    if refused == 0:
        return ("VOID: the Redis at its memory limit refused no write: no L2 write failed, "
                "so nothing was tested")
    return None


def held_hit_problem(answer: Answer, whole: int | None, chunk: int,
                     split: KeySplit | None) -> Problem | str | None:
    """What is wrong with ANSWER's hit after refused writes (a Problem), what could not
    be judged (a line), or None: no more than the WHOLE chunks of CHUNK tokens the L2
    held, and a fresh server 2 took none of it from its L1."""
    where = f"request {answer.case}, step {answer.step}"
    if answer.cached_tokens is None or whole is None:
        return f"{where}: its hit or what the L2 held is unknown"
    if answer.cached_tokens > whole * chunk:
        return Problem(f"{where}: a hit past what the L2 holds: {answer.cached_tokens} tokens "
                       f"cached, the L2 held {whole} whole chunk(s) of {chunk}", "hits")
    if answer.cached_tokens and split is not None and split.known and split.l1:
        return Problem(f"{where}: a fresh server 2 took keys from its L1: {split.describe()}",
                       "hits")
    return None


def _either_writer_audit(dirs: list[Path | None], step: str, ids: set[str]) -> dict[str, Any]:
    """B's loads at STEP of requests IDS against what either replica stored of the same
    chunk (both wrote it; either write may be the one the L2 kept), across the cell's
    pairs' audit logs: {} where the audit is off."""
    from pytest_sharedkv.stack import kv_audit
    from pytest_sharedkv.stack.request_tags import parse_request_tag

    if any(d is None for d in dirs):
        return {}
    records = [r for d in dirs if d is not None and d.exists()
               for r in kv_audit.read_records(d)]
    stored: dict[tuple[str, Any, Any], set[str]] = {}
    for r in records:
        if r.get("kind") == "store":
            stored.setdefault((r["key"], r["group"], r["layer"]), set()).add(r["digest"])
    compared = mismatches = unmatched = 0
    first = ""
    for r in records:
        if r.get("kind") != "load" or r.get("role") != "B":
            continue
        tag = parse_request_tag(str(r.get("request", "")))
        if tag is None or tag[0] not in ids or tag[1] != step:
            continue
        digests = stored.get((r["key"], r["group"], r["layer"]))
        if digests is None:
            unmatched += 1
            continue
        compared += 1
        if r["digest"] not in digests:
            mismatches += 1
            first = first or f"request {tag[0]} chunk {r['chunk']} layer {r['layer']}"
    return {"compared": compared, "mismatches": mismatches, "unmatched": unmatched,
            "first": first}
