"""The fault catalogue (``--sharedkv-fault-catalogue``): after a launched pair passed, the
faults a KV stack can make are injected one class at a time on a corpus slice, each a cell
as the triage's are, and each cell says which of the suite's checks saw it: the answers
(exact by construction), the in-engine KV audit (as the run has it: on by default), the hit
accounting. The result is the suite's sight on this stack, a detection matrix.

A cell whose hook never applied its fault is VOID (as an unfired gate is), with the hook's
reason. A class applied and caught by nothing fails the run: "this suite cannot see
<class> on this stack". Two classes expect no detection: a bit flipped where no engine
reads (the control) and an L2 load that fails (the stack must recompute): there a catch
fails the run and an exact answer is the pass. A delayed producer before every transfer is
caught only where the stack races: a catch is the stack's fault, not the suite's sight.

Cost: the hook's classes differ only in the server's environment, and the hook follows a
control file that names one class at a time, so one relaunched pair serves all of them
(each cell its own control, salts and step names); the delay goes into every process, so
its cell has a pair of its own. A pair cannot swap its LMCache server alone: the replicas
register their KV caches with the server once, at their start. The session's pair is
released first, so each cell runs alone on the GPU as the pass did.

Each cell is a record (kind fault-catalogue) the moment it is judged, handed to the run at
once, so a run cut short reports the cells that finished; the summary's CATALOGUE line is
read from those records and the classes the run chose, and says which never ran.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_sharedkv.corpus.cases import Case
from pytest_sharedkv.engine_hooks import delay_hook, fault_hook
from pytest_sharedkv.engine_hooks.fault_classes import (
    BY_NAME,
    CLASSES,
    Detector,
    FaultClass,
    Injector,
)
from pytest_sharedkv.report.markdown import markdown_table
from pytest_sharedkv.report.records import Check, Kind, Status
from pytest_sharedkv.service.runner import Runner
from pytest_sharedkv.service.triage import Relaunch, audit_count, tally_answers
from pytest_sharedkv.stack.pair import ReplicaError, ReplicaPair
from pytest_sharedkv.stack.steps import Step

if TYPE_CHECKING:
    from pytest_sharedkv.report.records import ResultSink
    from pytest_sharedkv.service.execute import Pass
    from pytest_sharedkv.stack.fixtures import PairSlot

TIER = "service_regression"
SIZE = "catalogue"  # the records' size key
ALL = "all"
# The slice each cell sends (the first requests of the pass's first size, cold on A then
# from the pool on B): 24 lets a class selected in 1 request of 2 apply about a dozen times
# in 3k prompts of ~94 chunks; the delayed cell, whose every transfer waits, sends 8.
SLICE, DELAY_SLICE = 24, 8
EVERY, SEED = 2, 0  # one request in EVERY selected, by a seeded hash of its id
CAUGHT, MISSED, UNKNOWN, OFF = "caught", "missed", "unknown", "off"
DETECTORS = tuple(d.value for d in Detector)  # answers, audit, hits
RACE_PROBES = frozenset({"delayed-producer"})  # a catch is the stack's race


class CatalogueError(ValueError):
    """A class list the catalogue cannot run; the message names what is wrong."""


def topology_problem(names: Sequence[str], hosts: bool) -> str | None:
    """Classes named one by one (not ``all``) that this topology cannot apply: the L2 load
    failure needs the two-host topology's L2. A usage error before any test."""
    if tuple(names) == (ALL,) or hosts:
        return None
    needs_l2 = [c.name for c in chosen(names) if c.injector is Injector.L2_FAULT_INJECT]
    if not needs_l2:
        return None
    return (f"{', '.join(needs_l2)} needs the two-host topology's L2, and this run's topology "
            "shares one LMCache server: give --sharedkv-topology hosts (where the L2 fault "
            "cell, --sharedkv-l2-fault-gap, injects it) or drop it")


def chosen(names: Sequence[str]) -> tuple[FaultClass, ...]:
    """The classes an option value names (``all``: every class, in the table's order)."""
    if tuple(names) == (ALL,):
        return CLASSES
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise CatalogueError(f"{', '.join(unknown)}: no fault class; it takes {ALL} or some "
                             f"of {', '.join(BY_NAME)}")
    return tuple(c for c in CLASSES if c.name in names)


def steps(name: str) -> tuple[Step, Step]:
    """A cell's own steps: its requests and audit digests never mix with another's."""
    return Step(f"catalogue-{name}-cold", "A", "none"), Step(f"catalogue-{name}-cross", "B",
                                                            "external")


@dataclass
class Cell:
    fault: FaultClass
    requests: int = 0
    exact: int = 0
    errors: int = 0
    applications: int = 0  # what the hook logged as applied (the delay: delayed calls)
    faulted: int = 0  # requests it applied to
    void: str | None = None
    not_applicable: str | None = None
    why_unknown: str | None = None
    audit_on: bool = True
    mismatches: int | None = None  # None: the audit compared nothing (off or VOID)
    compared: int = 0
    hit_problems: list[str] = field(default_factory=list)
    hits_unknown: str | None = None
    first_wrong: str = ""
    wall_s: float = 0.0

    @property
    def name(self) -> str:
        return self.fault.name

    @property
    def wrong(self) -> int:
        return self.requests - self.exact - self.errors

    def detections(self) -> dict[str, str]:
        """What each check made of the cell: caught, missed, off or unknown."""
        answers = (CAUGHT if self.wrong else UNKNOWN if self.errors or not self.requests
                   else MISSED)
        audit = (OFF if not self.audit_on else UNKNOWN if self.mismatches is None
                 else CAUGHT if self.mismatches else MISSED)
        hits = UNKNOWN if self.hits_unknown else CAUGHT if self.hit_problems else MISSED
        return {Detector.ANSWERS.value: answers, Detector.AUDIT.value: audit,
                Detector.HITS.value: hits}

    @property
    def caught_by(self) -> list[str]:
        return [d for d, state in self.detections().items() if state == CAUGHT]

    @property
    def status(self) -> str:
        """info (not applicable), unknown, void, pass (seen as the class expects), fail."""
        if self.not_applicable is not None:
            return "info"
        if self.why_unknown is not None:
            return "unknown"
        if self.void is not None:
            return "void"
        caught = self.caught_by
        if self.name in RACE_PROBES or not self.fault.caught_by:
            return "fail" if caught else "pass"
        if caught:
            return "pass"
        return "unknown" if UNKNOWN in self.detections().values() else "fail"

    def counts(self) -> str:
        seen = self.detections()
        audit = ("audit off" if seen["audit"] == OFF else "audit compared nothing"
                 if self.mismatches is None else f"{self.mismatches:,} mismatching digests "
                 f"(of {self.compared:,} the pair's audit compared)")
        hits = (f"hits unknown ({self.hits_unknown})" if self.hits_unknown
                else f"{len(self.hit_problems)} hit problems" if self.hit_problems
                else "hits as expected")
        return (f"{self.applications} applications in {self.faulted} requests; "
                f"{self.wrong} of {self.requests} answers wrong"
                + (f" ({self.errors} errors)" if self.errors else "")
                + f", {audit}, {hits}")

    def verdict(self) -> str:
        """The cell's line, from its status and counts."""
        name, status = self.name, self.status
        if status == "info":
            return f"{name}: n/a: {self.not_applicable}"
        if status == "void":
            return f"{name}: {self.void}"
        if status == "unknown" and self.why_unknown is not None:
            return f"{name}: UNKNOWN: {self.why_unknown}"
        caught = ", ".join(self.caught_by)
        if name in RACE_PROBES:
            return (f"{name}: the stack races: with a delayed producer before every KV "
                    f"transfer, caught by {caught} ({self.counts()})" if caught else
                    f"{name}: no race shows with a delayed producer before every KV transfer "
                    f"({self.counts()})")
        if not self.fault.caught_by:
            return (f"{name}: caught by {caught}, where nothing should catch it: the fault "
                    f"reached what an engine reads or the stack did not recover "
                    f"({self.counts()})" if caught else
                    f"{name}: caught by nothing, as expected ({self.counts()})")
        if caught:
            return f"{name}: caught by {caught} ({self.counts()})"
        if status == "unknown":
            return f"{name}: UNKNOWN: caught by nothing it could read ({self.counts()})"
        return f"this suite cannot see {name} on this stack ({self.counts()})"


@dataclass(frozen=True)
class Catalogue:
    cells: tuple[Cell, ...]
    wall_s: float

    @property
    def failures(self) -> list[Cell]:
        """Cells that fail the run: not seen, a control caught, a race, VOID, unknown."""
        return [c for c in self.cells if c.status in ("fail", "void", "unknown")]

    @property
    def void(self) -> str | None:
        """Why the catalogue proves nothing: it judged no class (every one n/a here), or
        None. A catalogue of nothing is VOID, never a PASS of "0 of 0"."""
        if any(c.not_applicable is None for c in self.cells):
            return None
        why = "; ".join(f"{c.name}: {c.not_applicable}" for c in self.cells)
        return (f"VOID: none of the {len(self.cells)} fault classes asked for could be "
                f"applied here, so the catalogue judged nothing ({why})")[:600]


WHOLE = "catalogue"  # the step of the record that says the whole catalogue is VOID


def record_void(results: ResultSink, labels: dict[str, str], found: Catalogue) -> None:
    """The record (kind fault-catalogue, status void) of a catalogue that judged no class."""
    assert found.void is not None
    results.check(TIER, {**labels, "size": SIZE, "step": WHOLE}, 0, 0,
                  kind=Kind.FAULT_CATALOGUE, status=Status.VOID, message=found.void)


def slice_of(cases: Sequence[Case], count: int) -> list[Case]:
    """The first COUNT measured requests of the pass's first size."""
    measured = [c for c in cases if c.role == "measured"]
    first = measured[0].size if measured else None
    return [c for c in measured if c.size == first][:count]


def judge(cell: Cell, runner: Runner, target: ReplicaPair, cases: Sequence[Case],
          cold: Step, cross: Step) -> None:
    """CELL's answers, audit and hits, from the cell's own requests."""
    from pytest_sharedkv.service.checks import hit_problem, totals_problems, totals_unknown

    run = runner.run
    tally_answers(cell, run, cases, cross.name, cold.name)
    for case in cases:
        answer = run.answer(case.id, cross.name)
        if answer is not None and not answer.error:
            problem = hit_problem(case, cross, answer)
            if problem is not None:
                cell.hit_problems.append(f"{case.id}: {problem}")
    cell.audit_on = target.kv_audit_dir is not None
    cell.mismatches, cell.compared = audit_count(target, cross.name, {c.id for c in cases})
    for totals in run.totals:
        if totals.step != cross.name:
            continue
        unknown = totals_unknown(totals)
        if unknown:
            cell.hits_unknown = unknown
        shareable = (sum(c.shareable or 0 for c in cases)
                     if all(c.shareable is not None for c in cases) else None)
        cell.hit_problems += [str(p) for p in totals_problems(totals, shareable)]
        if not unknown and totals.external is not None and totals.external != totals.cached:
            cell.hit_problems.append(f"{totals.group}: the engine counted {totals.external} "
                                     f"pool hit tokens, its responses {totals.cached}")


Log = Callable[[str], None]


@dataclass
class Plan:
    """How the cells run: the pass's pair and runner, and what each cell group needs."""

    service_pass: Pass
    slot: PairSlot
    log_dir: Callable[[str], Path]
    delay_cycles: int
    delay_settle_s: float

    @property
    def log(self) -> Log:
        return self.service_pass.runner.log

    def runner(self, target: ReplicaPair, key: str, settle_s: float | None = None) -> Runner:
        base = self.service_pass.runner
        return Runner(target, base.cases, lambda k: base.salts(f"catalogue-{key}/{k}"),
                      base.settle_s if settle_s is None else settle_s, base.concurrency,
                      base.log, base.store_s_per_token)

    def release(self) -> None:
        if self.slot.live:
            leftovers = self.slot.release()
            self.log("catalogue: released the session's pair (each cell runs alone, as the "
                     "pass did)" + (f"; processes {leftovers} survived" if leftovers else ""))

    def launch(self, what: str, relaunch: Relaunch) -> ReplicaPair:
        self.log(f"catalogue: starting a pair for {what}")
        return self.slot.launch(relaunch.apply)


def not_applicable(fault: FaultClass, pair: ReplicaPair, relaunchable: bool) -> str | None:
    """Why this run cannot inject FAULT into the pass's pair, or None."""
    if not relaunchable:
        return "the suite did not launch this pair: it cannot relaunch it with a fault"
    if fault.injector is Injector.L2_FAULT_INJECT:
        return ("it needs the two-host topology's L2 and is injected there by the L2 fault "
                "cell (--sharedkv-l2-fault-gap), not by the catalogue")
    if not pair.has_server and not str(pair.labels.get("provider", "")).startswith("stub"):
        return "this pair has no LMCache server to inject it in"
    return None


def _started(cells: Sequence[Cell], plan: Plan, what: str, relaunch: Relaunch,
             started: float) -> ReplicaPair | None:
    try:
        return plan.launch(what, relaunch)
    except (ReplicaError, RuntimeError, OSError) as exc:
        why = f"its pair did not start: {str(exc).splitlines()[0][:300]}"
        for cell in cells:
            cell.why_unknown, cell.wall_s = why, time.perf_counter() - started
        return None


Judged = Callable[["Cell"], None]  # told of each cell as it is judged (and judged again)


def _ignore(cell: Cell) -> None:
    """No one to tell of a judged cell."""


def close_cells(target: ReplicaPair, cells: Sequence[Cell], judged: Judged = _ignore) -> None:
    """Close TARGET; processes that survived make the CELLS judged on it unknown (each is
    judged again: its record says so)."""
    leftovers = target.close()
    for cell in cells:
        if leftovers and cell.why_unknown is None:
            cell.why_unknown = f"processes {leftovers} survived the cell's teardown"
            judged(cell)


def hook_cells(plan: Plan, cells: Sequence[Cell], cases: Sequence[Case],
               judged: Judged = _ignore) -> None:
    """The fault hook's classes, one after another on one relaunched pair: each cell writes
    its control, sends the slice cold on A and from the pool on B, removes it, counts the
    applications its own log lines report, and is told to JUDGED."""
    if not cells:
        return
    started = time.perf_counter()
    directory = plan.log_dir("faults")
    control, log = directory / "fault-control.json", directory / "fault.jsonl"
    relaunch = Relaunch(directory, server_env=((fault_hook.CONTROL_ENV, str(control)),
                                               (fault_hook.LOG_ENV, str(log))), kv_audit=None)
    target = _started(cells, plan, "the fault hook's classes", relaunch, started)
    if target is None:
        for cell in cells:
            judged(cell)
        return
    done: list[Cell] = []
    try:
        warmups = plan.service_pass.run.cases.by_role("warmup")
        if warmups:  # no control yet: the warm-ups are clean
            plan.runner(target, "warm-up").chain("catalogue warm-up", warmups,
                                                 steps("warm-up"))
        for cell in cells:
            began = time.perf_counter()
            cold, cross = steps(cell.name)
            runner = plan.runner(target, cell.name)
            control.write_text(json.dumps({"class": cell.name, "every": EVERY, "seed": SEED,
                                           "cell": cell.name}))
            try:
                runner.chain(f"catalogue {cell.name}", cases, (cold, cross))
            finally:
                control.unlink(missing_ok=True)
            judge(cell, runner, target, cases, cold, cross)
            records = fault_hook.of_cell(fault_hook.read_log(log), cell.name)
            applied = fault_hook.applications(records, cell.name)
            cell.applications = len(applied)
            cell.faulted = len({r.get("request") for r in applied})
            cell.void = fault_hook.void_problem(records, cell.name)
            cell.wall_s = time.perf_counter() - began
            done.append(cell)
            judged(cell)
            plan.log(f"catalogue {cell.name}: {cell.verdict()} ({cell.wall_s:.0f}s)")
    finally:
        close_cells(target, done, judged)


def delay_cell(plan: Plan, cell: Cell, cases: Sequence[Case], judged: Judged = _ignore
               ) -> None:
    """The delay hook before every KV transfer of every process, on a pair of its own."""
    started = time.perf_counter()
    relaunch = Relaunch(plan.log_dir("delay"), kv_audit=None,
                        inject_delay_cycles=plan.delay_cycles)
    target = _started([cell], plan, "a delayed producer", relaunch, started)
    if target is None:
        judged(cell)
        return
    try:
        cold, cross = steps(cell.name)
        runner = plan.runner(target, cell.name, plan.delay_settle_s)
        runner.chain(f"catalogue {cell.name}", cases, (cold, cross))
        judge(cell, runner, target, cases, cold, cross)
        calls = (delay_hook.read_log(target.inject_log) if target.inject_log is not None
                 else None)
        cell.applications = calls.get(delay_hook.SERVER_ROLE, 0) if calls is not None else 0
        cell.faulted = len(cases) if cell.applications else 0
        cell.void = delay_hook.void_problem(calls, "catalogue cell")
    finally:
        close_cells(target, [cell])
    cell.wall_s = time.perf_counter() - started
    judged(cell)
    plan.log(f"catalogue {cell.name}: {cell.verdict()} ({cell.wall_s:.0f}s)")


def run(plan: Plan, faults: Sequence[FaultClass], judged: Judged = _ignore) -> Catalogue:
    """Every class of FAULTS a cell: the hook's on one relaunched pair, the delay on its
    own; a class this run cannot inject is n/a, with why. Each cell is told to JUDGED as
    soon as it is judged (an n/a one at once)."""
    started = time.perf_counter()
    service_pass = plan.service_pass
    pair, cases = service_pass.pair, service_pass.run.cases.cases
    cells = [Cell(f, not_applicable=not_applicable(f, pair, plan.slot.relaunchable))
             for f in faults]
    live = [c for c in cells if c.not_applicable is None]
    for cell in cells:
        if cell.not_applicable is not None:
            judged(cell)
    if live:
        plan.release()
    hook_cells(plan, [c for c in live if c.fault.injector is Injector.FAULT_HOOK],
               slice_of(cases, SLICE), judged)
    for cell in live:
        if cell.fault.injector is Injector.DELAY_HOOK:
            delay_cell(plan, cell, slice_of(cases, DELAY_SLICE), judged)
    return Catalogue(tuple(cells), time.perf_counter() - started)


def _detail(cell: Cell) -> dict[str, object]:
    fault = cell.fault
    return {"class": cell.name, "does": fault.does, "injector": fault.injector.value,
            "expected": sorted(d.value for d in fault.caught_by),
            "race_probe": cell.name in RACE_PROBES,
            "detections": cell.detections(), "caught_by": cell.caught_by,
            "applications": cell.applications, "faulted_requests": cell.faulted,
            "wrong": cell.wrong, "errors": cell.errors,
            "mismatches": cell.mismatches, "compared": cell.compared,
            "hit_problems": cell.hit_problems[:20], "hits_unknown": cell.hits_unknown,
            "void": cell.void, "not_applicable": cell.not_applicable,
            "why_unknown": cell.why_unknown, "first_wrong": cell.first_wrong,
            "wall_s": round(cell.wall_s, 1)}


class Recorder:
    """The catalogue's records, one per class (the matrix's row: kind fault-catalogue, its
    status), each made the moment its cell is judged and handed to the run at once
    (``ResultSink.flush``): a run killed during a later cell still reports it. A cell
    judged again (its pair's teardown left processes: unknown) has its record amended in
    place, never a second one."""

    def __init__(self, results: ResultSink, labels: dict[str, str]) -> None:
        self.results, self.labels = results, labels
        self.made: dict[str, Check] = {}

    def __call__(self, cell: Cell) -> None:
        made = self.made.get(cell.name)
        if made is None:
            self.made[cell.name] = self.results.check(
                TIER, {**self.labels, "size": SIZE, "step": cell.name}, cell.exact,
                cell.requests, kind=Kind.FAULT_CATALOGUE, status=cell.status,
                message=cell.verdict()[:600], detail=_detail(cell))
        else:
            made.status = Status(cell.status)
            made.message, made.detail = cell.verdict()[:600], _detail(cell)
        self.results.flush()


# -- the summary -------------------------------------------------------------------------


def _records(checks: Sequence[Check]) -> list[Check]:
    """The cells' records, in the class table's order (a cell is recorded when judged)."""
    order = {name: i for i, name in enumerate(BY_NAME)}
    found = [c for c in checks if c.kind == Kind.FAULT_CATALOGUE and c.key.get("step") != WHOLE]
    return sorted(found, key=lambda c: order.get(str(c.key.get("step", "")), len(order)))


def line(checks: Sequence[Check], name: str, asked: Sequence[str] | None,
         finished: Set[str]) -> str | None:
    """CATALOGUE <pair>: what the suite saw and what it could not, from the pair's records
    (CHECKS); ASKED: the classes the run chose (None: not asked); FINISHED: the tests that
    have an outcome. A catalogue whose test has none, or that left a chosen class without a
    record, says how far it got and which classes never ran. None where it was neither
    asked for nor recorded."""
    whole = next((c for c in checks if c.kind == Kind.FAULT_CATALOGUE
                  and c.key.get("step") == WHOLE), None)
    if whole is not None:
        return f"CATALOGUE {name}: {whole.message}"
    cells = _records(checks)
    if not cells:
        return (None if asked is None else f"CATALOGUE {name}: none of the {len(asked)} "
                "classes asked for has a record")
    names = [str(c.key.get("step", "")) for c in cells]
    missing = [n for n in asked or () if n not in names]
    cut = any(c.nodeid not in finished for c in cells)  # its test has no outcome
    head = f"CATALOGUE {name}: "
    if cut or missing:
        total = len(asked) if asked is not None else len(cells)
        head += (f"{'interrupted' if cut else 'stopped'} after {len(cells)} of {total} "
                 "classes" + (f" (not run: {', '.join(missing)})" if missing else "")
                 + "; of those, ")
    ran = [c for c in cells if c.status != Status.INFO]
    seen = [c for c in ran if c.status == Status.PASS]
    blind = [c for c in cells if c.status == Status.FAIL and c.detail.get("expected")
             and not c.detail.get("race_probe")]
    wall = sum(float(c.detail.get("wall_s") or 0) for c in cells)
    text = (head + f"{len(seen)} of {len(ran)} fault classes seen as expected ({wall:.0f} s "
            "in its cells)")
    if blind:
        text += ("; this suite cannot see "
                 f"{', '.join(str(c.key.get('step')) for c in blind)} on this stack")
    others = [c.message for c in cells if c not in blind
              and c.status in (Status.FAIL, Status.VOID, Status.UNKNOWN)]
    return text + ("; " + "; ".join(others) if others else "")


def matrix(checks: Sequence[Check]) -> list[str]:
    """The detection matrix: fault x (answers, audit, hits), with counts."""
    rows = []
    for c in _records(checks):
        d = c.detail
        seen = d.get("detections") or {}
        ran = c.status not in ("info", "unknown") or bool(d.get("applications"))
        rows.append([str(c.key.get("allocator", "")), str(c.key.get("step", "")),
                     str(d.get("applications", "-")) if ran else "-",
                     *(str(seen.get(k, "-")) if ran else "-" for k in DETECTORS),
                     {"pass": "seen", "fail": "NOT SEEN" if d.get("expected") and not
                      d.get("race_probe") else "FAIL", "void": "VOID",
                      "info": "n/a"}.get(c.status, "unknown"),
                     str(d.get("wall_s", "-"))])
    if not rows:
        return []
    return ["fault catalogue: each class injected on a slice of the corpus, and which "
            "checks caught it:",
            *markdown_table(["allocator", "class", "applied", *DETECTORS, "verdict",
                             "wall s"], rows)]


def offer(checks: Sequence[Check], provider: str, name: str,
          asked: Sequence[str] | None = None) -> list[str]:
    """The line that offers the catalogue to a launched pair that passed (none where the
    catalogue was asked for or ran, or the suite launched nothing)."""
    if provider == "external" or asked is not None or _records(checks):
        return []
    return [f"CATALOGUE {name}: not run; --sharedkv-fault-catalogue {ALL} relaunches this "
            "pair once per fault class on a slice of the corpus and shows which ones the "
            "suite's checks can see"]
