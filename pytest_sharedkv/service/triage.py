"""Service-level triage (``--sharedkv-triage``): a launched pair that answered wrong after
cross-replica hits sends the same corpus slice again under controls, each a cell of its
own with the KV audit, and the controls that removed the fault name its class.

A control *removes* the fault when its cell answers every cross-replica request as
constructed and the audit finds no mismatching digest; it *leaves* it when either shows
again. A cell that could not start, lost requests, or whose control never acted (the
server's sync log is empty, a code remedy's log shows no copy it changed) is unknown and
decides nothing; a control the pair offers nothing to change (no server, no other
allocator, no torch-fallback copy for a code remedy) is n/a.

Two cells test code remedies for LMCache's torch-fallback copy (``stream_remedy_hook``):
its copy queued on the current stream, and its copy made to wait for the producing stream.
They apply to the lazy allocator on the torch fallback, whose transfers run that copy (the
stub, which stands in for the server's hooks, too). A code remedy is said as proven only
where its cell removed the fault; the verdict says each one's outcome with counts.

Cells run one after the other, each alone on the GPU as the pass was: the session's pair
is released (``PairSlot.release``) before the first cell that launches a pair of its own,
and the next test that needs it gets it launched again, so the triage's place in the test
order changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_sharedkv.corpus.cases import Case
from pytest_sharedkv.engine_hooks import stream_remedy_hook
from pytest_sharedkv.service.answers import ServiceRun
from pytest_sharedkv.service.runner import Runner, Salts
from pytest_sharedkv.stack.launch.spec import LaunchSpec
from pytest_sharedkv.stack.pair import ReplicaError, ReplicaPair
from pytest_sharedkv.stack.steps import Step

if TYPE_CHECKING:
    from pytest_sharedkv.report.records import ResultSink
    from pytest_sharedkv.service.execute import Pass
    from pytest_sharedkv.stack.fixtures import PairSlot

# the cells' own step names: their requests (and audit digests) never mix with the pass's
COLD = Step("triage-cold", "A", "none")
CROSS = Step("triage-cross", "B", "external")
LAUNCH_BLOCKING = (("CUDA_LAUNCH_BLOCKING", "1"),)
OTHER_ALLOCATOR = {"lazy": "mixed", "mixed": "lazy"}
ALLOCATOR_REMEDY = {"mixed": "start the LMCache server with --no-l1-use-lazy",
                    "lazy": "start the LMCache server with --l1-use-lazy"}
ORDERING, CONCURRENCY, ALLOCATOR = "ordering", "concurrency", "allocator"
FALLBACK = "torch-fallback"  # host/lmcache_status's kernel path the code remedies change
TIER = "service_regression"


@dataclass(frozen=True)
class Control:
    """One triage control: what it changes, the family of fault it rules in when it removes
    one, and the deployable remedy it then proves ("" where it is a diagnosis only)."""

    name: str
    what: str
    family: str
    server_env: tuple[tuple[str, str], ...] = ()
    replica_env: tuple[tuple[str, str], ...] = ()
    sync_transfers: bool = False
    one_in_flight: bool = False
    allocator: str | None = None  # the other allocator's name
    remedy: str = ""
    suggestion: str = ""  # what a user could try where it removed the fault, untested
    stream_remedy: str | None = None  # stream_remedy_hook's remedy the server runs

    @property
    def needs_server(self) -> bool:
        """Whether it changes only the LMCache server (a pair without one: not applicable)."""
        return (bool(self.server_env) and not self.replica_env) or self.sync_transfers \
            or self.allocator is not None or self.stream_remedy is not None

    def not_applicable(self, relaunchable: bool, has_server: bool, allocator: str,
                       kernel_path: str | None = None, stub: bool = False) -> str | None:
        """Why this control has nothing to change on the pass's pair, or None. KERNEL_PATH:
        LMCache's in this run (None: not probed); STUB: the test double, which stands in
        for the server's hooks."""
        if self.one_in_flight:
            return None
        if not relaunchable:
            return "the suite did not launch this pair: it cannot relaunch it"
        if self.stream_remedy is not None:
            if stub:
                return None
            if not has_server:
                return "this pair has no LMCache server for the remedy to change"
            if allocator != "lazy" or kernel_path != FALLBACK:
                return (f"the remedy changes the torch fallback's copy, which the lazy "
                        f"allocator's transfers run; this pair runs the {allocator} allocator "
                        f"on LMCache's {kernel_path or 'unprobed'} kernel path")
            return None
        if self.needs_server and not has_server:
            return "this pair has no LMCache server for the control to change"
        if self.allocator == "":
            return f"the allocator {allocator!r} has no other to compare"
        return None

    def relaunch(self, log_dir: Path) -> Relaunch:
        server_env = self.server_env
        if self.stream_remedy is not None:
            server_env += ((stream_remedy_hook.REMEDY_ENV, self.stream_remedy),
                           (stream_remedy_hook.LOG_ENV, str(remedy_log(log_dir))))
        return Relaunch(log_dir, server_env, self.replica_env, self.sync_transfers,
                        self.allocator or None)


def remedy_log(log_dir: Path) -> Path:
    """Where a code remedy's cell has the server log each copy it changed."""
    return log_dir / "stream-remedy.jsonl"


@dataclass(frozen=True)
class Relaunch:
    """What a control's cell changes in the pass's launch: its own logs, its control, and
    the KV audit on; no sensitivity gate and no injected delay (the cell judges the fault
    the pass saw, not the gate or the delay). The fault catalogue's cells keep the pass's
    audit setting (``kv_audit`` None: the catalogue shows what the run as configured sees)
    and inject the delay where that is the class."""

    log_dir: Path
    server_env: tuple[tuple[str, str], ...] = ()
    replica_env: tuple[tuple[str, str], ...] = ()
    sync_transfers: bool = False
    allocator: str | None = None  # None: the pass's
    kv_audit: bool | None = True  # None: the pass's
    inject_delay_cycles: int = 0

    def apply(self, spec: LaunchSpec) -> LaunchSpec:
        """SPEC with these changes; the environment the pass's launch set stays, with the
        control's on top."""
        audit = spec.kv_audit if self.kv_audit is None else self.kv_audit
        return replace(spec, log_dir=self.log_dir, gate=False, kv_audit=audit,
                       inject_delay_cycles=self.inject_delay_cycles,
                       server_env=spec.server_env + self.server_env,
                       replica_env=spec.replica_env + self.replica_env,
                       sync_transfers=self.sync_transfers,
                       allocator=self.allocator or spec.allocator)


def controls_for(allocator: str) -> tuple[Control, ...]:
    """The controls, cheapest first (one in flight reuses the pair; the rest relaunch)."""
    controls = [
        Control("one-in-flight", "one request in flight (no store overlapping a retrieve)",
                CONCURRENCY, one_in_flight=True,
                suggestion="send the replicas one request at a time"),
        Control("launch-blocking-all",
                "CUDA_LAUNCH_BLOCKING=1 in the LMCache server and both replicas", ORDERING,
                server_env=LAUNCH_BLOCKING, replica_env=LAUNCH_BLOCKING),
        Control("launch-blocking-server", "CUDA_LAUNCH_BLOCKING=1 in the LMCache server only",
                ORDERING, server_env=LAUNCH_BLOCKING,
                remedy="set CUDA_LAUNCH_BLOCKING=1 in the LMCache server's environment "
                       "(every launch there synchronous: it costs the server throughput)"),
        Control("sync-transfers",
                "a device synchronize before and after every KV transfer in the server",
                ORDERING, sync_transfers=True,
                suggestion="make LMCache's KV transfers wait for the streams that produce "
                           "and read their buffers (a code change)"),
        Control(stream_remedy_hook.CURRENT_STREAM,
                "the fallback's copy on the current stream (cudaMemcpyAsync, split at pin "
                "chunks)", ORDERING, stream_remedy=stream_remedy_hook.CURRENT_STREAM,
                remedy="patch LMCache's torch-fallback lmcache_memcpy_async to queue its copy "
                       "on the current stream with cudaMemcpyAsync, split at pin-chunk "
                       "boundaries as the compiled kernel does (a code change)"),
        Control(stream_remedy_hook.WAIT_PRODUCER,
                "the fallback's copy waiting for the producing stream", ORDERING,
                stream_remedy=stream_remedy_hook.WAIT_PRODUCER,
                remedy="patch LMCache's torch-fallback lmcache_memcpy_async to make its copy "
                       "wait for the stream that produced its buffer (an event recorded there, "
                       "waited by the stream the copy runs on; a code change)"),
    ]
    other = OTHER_ALLOCATOR.get(allocator)
    controls.append(Control("other-allocator", f"the {other or 'other'} allocator", ALLOCATOR,
                            allocator=other or "",
                            remedy=ALLOCATOR_REMEDY.get(other or "", "")))
    return tuple(controls)


@dataclass
class Cell:
    control: Control
    requests: int = 0
    exact: int = 0
    errors: int = 0
    mismatches: int | None = None  # None: the cell's audit compared nothing
    compared: int = 0
    why_unknown: str | None = None
    not_applicable: str | None = None  # why this pair offers the control nothing to change
    wall_s: float = 0.0
    first_wrong: str = ""
    launches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def wrong(self) -> int:
        return self.requests - self.exact - self.errors

    @property
    def removed(self) -> bool | None:
        """True: the fault is gone in this cell; False: it showed again; None: unknown."""
        if self.why_unknown is not None or self.not_applicable is not None:
            return None
        if self.wrong or self.mismatches:
            return False
        if self.errors or not self.requests:
            return None
        return True

    @property
    def status(self) -> str:
        if self.not_applicable is not None:
            return "info"
        return {True: "pass", False: "fail", None: "unknown"}[self.removed]

    def counts(self) -> str:
        audit = ("audit off" if self.mismatches is None
                 else f"{self.mismatches:,} mismatching digests of {self.compared:,}")
        return (f"{self.wrong} of {self.requests} wrong, {audit}"
                + (f", {self.errors} errors" if self.errors else ""))


@dataclass(frozen=True)
class Base:
    """The pass's own divergence in the slice the cells send again."""

    allocator: str
    group: str
    requests: int
    wrong: int
    mismatches: int | None


@dataclass(frozen=True)
class Verdict:
    klass: str  # none | ordering | ordering-concurrency | concurrency | allocator |
    # not-ordering | persists | undecided
    text: str
    proven: tuple[str, ...]  # remedies a cell of this run proved

    def line(self, base: Base) -> str:
        audit = "" if base.mismatches is None else f", {base.mismatches:,} mismatching digests"
        return (f"TRIAGE {base.allocator}: {self.text} (the pass: {base.wrong} of "
                f"{base.requests} {base.group} cross-replica answers wrong{audit})")


def proven_line(remedy: str, cell: str, exact: int, requests: int, mismatches: object
                ) -> str:
    """A remedy as a triage cell proved it (the verdict and the summary say it alike)."""
    audit = ("the audit compared nothing (answers only)" if mismatches is None
             else f"{mismatches} mismatching digests")
    return f"{remedy} (proven by the triage cell {cell}: {exact}/{requests} exact, {audit})"


def suggestion_line(suggestion: str, cell: str) -> str:
    """What a cell's control suggests where it removed the fault but is not itself a
    remedy an operator can apply as tested (one request at a time, a patched LMCache)."""
    return f"{suggestion} (the triage cell {cell} removed the fault; as a remedy untested)"


def _names(cells: Sequence[Cell]) -> str:
    return ", ".join(c.control.what for c in cells)


def classify(base: Base, cells: Sequence[Cell]) -> Verdict:
    """The class of fault, from which controls removed it and which left it; then what each
    code remedy's cell did (a remedy is proven only where its cell removed the fault)."""
    verdict = _classify(base, cells)
    coded = [c for c in cells if c.control.stream_remedy is not None
             and c.not_applicable is None]
    if verdict.klass == "none" or not coded:
        return verdict
    return replace(verdict, text=verdict.text + "; code remedies: " + "; ".join(
        f"{c.control.name} {remedy_outcome(c)}" for c in coded))


def remedy_outcome(cell: Cell) -> str:
    """What a code remedy's cell did to the fault, with its counts."""
    if cell.removed is None:
        return f"decided nothing ({cell.why_unknown or cell.counts()})"
    return f"{'removed it' if cell.removed else 'left it'} ({cell.counts()})"


def _classify(base: Base, cells: Sequence[Cell]) -> Verdict:
    removed = [c for c in cells if c.removed is True]
    unknown = [c for c in cells if c.removed is None and c.not_applicable is None]
    by_name = {c.control.name: c for c in cells}
    ordering = [c for c in removed if c.control.family == ORDERING]
    concurrent = [c for c in removed if c.control.family == CONCURRENCY]
    allocator = [c for c in removed if c.control.family == ALLOCATOR]
    blocking = by_name.get("launch-blocking-all")
    proven = tuple(proven_line(c.control.remedy, c.control.name, c.exact, c.requests,
                               c.mismatches) for c in removed if c.control.remedy)
    if not base.wrong and not base.mismatches:
        return Verdict("none", "nothing to triage: no wrong answer and no mismatching digest",
                       ())
    persists_blocking = blocking is not None and blocking.removed is False
    if concurrent and not ordering:
        text = "interaction between concurrent operations (removed by one request in flight)"
        if persists_blocking and blocking is not None:
            text += ("; not a stream-ordering fault: it persists with CUDA_LAUNCH_BLOCKING=1 "
                     f"in the server and replicas ({blocking.counts()})")
        return Verdict("concurrency", text, proven)
    if persists_blocking and blocking is not None:
        text = ("not an ordering fault (persists with CUDA_LAUNCH_BLOCKING=1 in the server "
                f"and replicas: {blocking.counts()})")
        if allocator:
            text += (f"; removed by {_names(allocator)}: a fault of the {base.allocator} "
                     "allocator's path")
        return Verdict("not-ordering", text, proven)
    if ordering and concurrent:
        return Verdict("ordering-concurrency", "stream-ordering race between concurrent "
                       f"operations (removed by {_names(ordering)}, and by one request in "
                       "flight)", proven)
    if ordering:
        return Verdict("ordering", f"stream-ordering race (removed by {_names(ordering)})",
                       proven)
    if allocator and not unknown:
        return Verdict("allocator", f"a fault of the {base.allocator} allocator's path "
                       f"(removed only by {_names(allocator)}; every ordering and concurrency "
                       "control left it)", proven)
    if not unknown:
        return Verdict("persists", "not removed by any control (it persists under every "
                       "control)", proven)
    why = "; ".join(f"{c.control.name}: {c.why_unknown or c.counts()}" for c in unknown)
    return Verdict("undecided", f"UNDECIDED: the controls that could tell could not be "
                   f"judged ({why})", proven)


def right_answer(run: ServiceRun, case: Case, step: str = "cross", cold_step: str = "cold"
                 ) -> bool | None:
    """Whether CASE's answer at STEP is the right one (``checks.diverged``); None where the
    request failed. A text-corpus answer with no cold answer to compare counts as wrong."""
    from pytest_sharedkv.service.checks import diverged

    answer, cold = run.answer(case.id, step), run.answer(case.id, cold_step)
    if answer is None or answer.error:
        return None
    if case.expected is None and (cold is None or cold.error):
        return False
    return diverged(run, case, answer, cold_step) is None


class Tally(Protocol):
    """A cell's answer counts (the triage's and the catalogue's cells)."""

    requests: int
    exact: int
    errors: int
    first_wrong: str


def tally_answers(cell: Tally, run: ServiceRun, cases: Sequence[Case], step: str = "cross",
                  cold_step: str = "cold") -> None:
    """Count CASES' answers at STEP into CELL (``right_answer``), keeping the first wrong."""
    for case in cases:
        right = right_answer(run, case, step, cold_step)
        cell.requests += 1
        cell.exact += right is True
        cell.errors += right is None
        if right is False and not cell.first_wrong:
            answer = run.answer(case.id, step)
            cell.first_wrong = f"{case.id} answered {answer.text[:60] if answer else ''!r}"


def audit_count(pair: ReplicaPair, step: str, ids: set[str]) -> tuple[int | None, int]:
    """(mismatching digests B loaded at STEP for the requests IDS, digests compared); None
    where the pair's audit is off or compared nothing."""
    from pytest_sharedkv.stack import kv_audit

    report = kv_audit.audit(pair.kv_audit_dir)
    if report is None or report.void is not None:
        return None, 0
    return sum(m.step == step and m.request in ids for m in report.mismatches), report.compared


def base_of(run: ServiceRun, pair: ReplicaPair, group: str) -> tuple[Base, list[Case]]:
    """The pass's own divergence in GROUP (the slice the cells send again), and its cases."""
    cases = [c for c in run.cases.cases if c.role == "measured" and c.size == group]
    mismatches, _ = audit_count(pair, "cross", {c.id for c in cases})
    wrong = sum(right_answer(run, c) is False for c in cases)
    return Base(str(pair.labels.get("allocator", "")), group, len(cases), wrong,
                mismatches), cases


Relauncher = Callable[[Relaunch], ReplicaPair]


def run_cell(control: Control, pair: ReplicaPair, cases: Sequence[Case], warmups: Sequence[Case],
             runner_of: Callable[[ReplicaPair, Salts, int], Runner], salts: Salts,
             concurrency: int, log_dir: Path, log: Callable[[str], None],
             relaunch: Relauncher | None, has_server: bool, kernel_path: str | None = None
             ) -> Cell:
    """One control's cell: PAIR (the pass's, for one-in-flight) or a pair of its own that
    RELAUNCH starts with the control's change (None: the suite launched nothing it could
    start again), COLD on A and CROSS on B for every case, then its audit and, for a code
    remedy, the server's log of the copies it changed (none: VOID)."""
    started = time.perf_counter()
    cell = Cell(control)
    target = pair
    cell.not_applicable = control.not_applicable(relaunch is not None, has_server,
                                                 pair.labels.get("allocator", ""),
                                                 kernel_path, is_stub(pair))
    if cell.not_applicable is not None:
        return cell
    if relaunch is not None and not control.one_in_flight:
        log(f"triage {control.name}: starting a pair with {control.what}")
        try:
            target = relaunch(control.relaunch(log_dir))
        except (ReplicaError, RuntimeError, OSError) as exc:
            cell.why_unknown = f"its pair did not start: {str(exc).splitlines()[0][:300]}"
            cell.wall_s = time.perf_counter() - started
            return cell
        cell.launches = list(target.launches)
    try:
        runner = runner_of(target, lambda key: salts(f"triage-{control.name}/{key}"),
                           1 if control.one_in_flight else concurrency)
        if target is not pair and warmups:
            runner.chain("triage warm-up", warmups, (COLD, CROSS))
        runner.chain(f"triage {control.name}", cases, (COLD, CROSS))
        run = runner.run
        tally_answers(cell, run, cases, CROSS.name, COLD.name)
        cell.mismatches, cell.compared = audit_count(target, CROSS.name, {c.id for c in cases})
        if control.sync_transfers:
            from pytest_sharedkv.engine_hooks.delay_hook import read_log

            done = dict(read_log(target.sync_log)) if target.sync_log is not None else {}
            if not done.get("server"):
                cell.why_unknown = ("VOID: the synchronize never ran in the LMCache server "
                                    f"(synchronized calls per process: {done or 'none'})")
        if control.stream_remedy is not None:
            cell.why_unknown = cell.why_unknown or stream_remedy_hook.void_problem(
                stream_remedy_hook.read_log(remedy_log(log_dir)), control.stream_remedy)
    finally:
        if target is not pair:
            leftovers = target.close()
            if leftovers and cell.why_unknown is None:
                cell.why_unknown = f"processes {leftovers} survived the cell's teardown"
    cell.wall_s = time.perf_counter() - started
    log(f"triage {control.name}: {cell.counts()} ({cell.wall_s:.0f}s)")
    return cell


def is_stub(pair: ReplicaPair) -> bool:
    """The test double, whose replicas stand in for the server's hooks."""
    return str(pair.labels.get("provider", "")).startswith("stub")


def diverging_group(run: ServiceRun) -> str | None:
    """The first size whose cross-replica answers diverged (the slice the cells send)."""
    for size in run.cases.sizes():
        if any(c.role == "measured" and c.size == size and right_answer(run, c) is False
               for c in run.cases.cases):
            return size
    return None


def cross_line(run: ServiceRun, description: str) -> str:
    """What the pass's cross-replica step sent and got back, from its answers: never an
    answer that was not received."""
    sent = [(c, a) for c in run.cases.cases if c.role == "measured"
            for a in [run.answer(c.id, "cross")] if a is not None]
    failed = [a for _, a in sent if a.error]
    right = sum(right_answer(run, c) is True for c, _ in sent)
    if not sent:
        return f"{description} was sent no cross-replica request"
    line = (f"{description} answered {len(sent) - len(failed)} of {len(sent)} cross-replica "
            "requests")
    if failed:
        line += f" ({len(failed)} failed, first: {failed[0].error})"
    answered = len(sent) - len(failed)
    if answered:
        line += (f", all {answered} answers right" if right == answered
                 else f", {right} of the {answered} answers right")
    return line


@dataclass(frozen=True)
class Diagnosis:
    """What the pass leaves the triage: its diverging size group, or the reason there is
    nothing to triage (the pass stopped, or no answer was wrong), said from its data."""

    group: str | None
    error: str | None
    nothing: str


def diagnose(service_pass: Pass) -> Diagnosis:
    """The pass (every stage of it, whatever ran before) and what it leaves to triage."""
    from pytest_sharedkv.service.execute import PROTOCOL

    run = service_pass.ensure(PROTOCOL)
    group = None if run.error else diverging_group(run)
    return Diagnosis(group, run.error,
                     f"nothing to triage: {cross_line(run, service_pass.pair.description)}")


@dataclass(frozen=True)
class Triage:
    base: Base
    cells: tuple[Cell, ...]
    verdict: Verdict

    @property
    def unknown(self) -> list[Cell]:
        """Cells that decided nothing although their control applied."""
        return [c for c in self.cells if c.removed is None and c.not_applicable is None]


def triage(service_pass: Pass, slot: PairSlot, group: str,
           log_dir: Callable[[str], Path], kernel_path: str | None = None,
           on_cell: Callable[[Base, Cell], None] | None = None) -> Triage:
    """GROUP of the pass again under each control, a cell each (LOG_DIR: a directory per
    control; KERNEL_PATH: LMCache's in this run, which the code remedies need to be the
    torch fallback; ON_CELL: called with each cell once it is judged, so that a run cut
    short keeps the cells it finished: ``record_cell``). One in flight runs on the session's
    pair; before the first cell that starts a pair of its own, the session's pair is
    released (the next test to need it gets it started again), so each cell runs alone on
    the GPU, as the pass did."""
    run, pair, runner = service_pass.run, service_pass.pair, service_pass.runner
    base, cases = base_of(run, pair, group)

    def runner_of(target: ReplicaPair, salts: Salts, concurrency: int) -> Runner:
        return Runner(target, run.cases, salts, runner.settle_s, concurrency, runner.log,
                      runner.store_s_per_token)

    relaunch = (lambda changes: slot.launch(changes.apply)) if slot.relaunchable else None
    cells = []
    for control in controls_for(base.allocator):
        alone = control.not_applicable(slot.relaunchable, pair.has_server, base.allocator,
                                       kernel_path, is_stub(pair)) is None \
            and not control.one_in_flight
        if alone and slot.live:
            leftovers = slot.release()
            runner.log("triage: released the session's pair (each cell runs alone, as the "
                       "pass did)" + (f"; processes {leftovers} survived" if leftovers else ""))
        cells.append(run_cell(control, slot.pair if control.one_in_flight else pair, cases,
                              run.cases.by_role("warmup"), runner_of, runner.salts,
                              runner.concurrency, log_dir(control.name), runner.log,
                              relaunch, pair.has_server, kernel_path))
        if on_cell is not None:
            on_cell(base, cells[-1])
    return Triage(base, tuple(cells), classify(base, cells))


def record_cell(results: ResultSink, labels: dict[str, str], base: Base, cell: Cell) -> None:
    """One cell's record, written when the cell is judged (the report is written as the run
    goes, so a triage cut short keeps its finished cells and the summary's table and proven
    remedies read them)."""
    control = cell.control
    results.check(
        TIER, {**labels, "size": "triage", "step": control.name}, cell.exact,
        cell.requests, kind="triage", status=cell.status,
        message=cell.not_applicable or cell.why_unknown or cell.first_wrong,
        detail={"control": control.what, "family": control.family,
                "group": base.group, "wrong": cell.wrong, "errors": cell.errors,
                "mismatches": cell.mismatches, "compared": cell.compared,
                "removed": cell.removed, "remedy": control.remedy,
                "suggestion": control.suggestion, "counts": cell.counts(),
                "stream_remedy": control.stream_remedy,
                "wall_s": round(cell.wall_s, 1), "launches": cell.launches})


def record_verdict(results: ResultSink, labels: dict[str, str], found: Triage) -> None:
    """The verdict as a note (the summary's TRIAGE line), once every cell is judged."""
    results.note(TIER, found.verdict.line(found.base), kind="triage-verdict",
                 status="unknown" if found.verdict.klass == "undecided" else "info")
