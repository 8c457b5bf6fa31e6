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
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.corpus.cases import Case, CaseSet
from pytest_sharedkv.report.records import Problem
from pytest_sharedkv.service.answers import ServiceRun
from pytest_sharedkv.service.protocol import run_protocol
from pytest_sharedkv.service.runner import Runner, Salts
from pytest_sharedkv.service.sensitivity import run_gate
from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
from pytest_sharedkv.stack.pair import ReplicaPair

if TYPE_CHECKING:
    from pytest_sharedkv.stack.fixtures import PairSlot
    from pytest_sharedkv.stack.l2 import L2
    from pytest_sharedkv.stack.providers import LaunchSpec

GATE, SESSIONS, PROTOCOL = "gate", "sessions", "protocol"


class Pass:
    def __init__(self, pair: ReplicaPair, cases: CaseSet, salts: Salts, settle_s: float,
                 concurrency: int = 8, log: Callable[[str], None] | None = None,
                 store_s_per_token: float = STORE_S_PER_TOKEN) -> None:
        self.pair = pair
        self.runner = Runner(pair, cases, salts, settle_s, concurrency, log,
                             store_s_per_token)
        self.stages = [GATE, *cases.sizes(), SESSIONS, PROTOCOL]
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
            runner.run.gate = run_gate(runner, self.pair.gate_control, self.pair.gate_log,
                                       self.pair.record.stack)
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
class GapCell:
    """The L2 fault cell: server 2's L2 (LMCache's ``fault_inject`` over the session's
    L2) fails to load chunk GAP of every lookup, so B must take exactly the chunks before
    it from the L2 and recompute the rest. SIZE: the group sent; PROBLEMS what broke
    that, UNKNOWN what could not be judged; DETAIL the record's evidence."""

    gap: int
    size: str | None = None
    requests: int = 0
    exact: int = 0
    problems: list[Problem] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


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
    from pytest_sharedkv.stack.l2 import fault_inject
    from pytest_sharedkv.stack.pair import ReplicaError
    from pytest_sharedkv.stack.steps import step as step_named

    cell = GapCell(gap)
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
                       "cached_by_request": cached,
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
                              for m in report.mismatches)}
