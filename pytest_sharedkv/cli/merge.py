"""``python -m pytest_sharedkv merge-screenings OUT.json IN1.json IN2.json ...``: one
screening from blocks measured in separate runs.

Three block pairs give a bootstrap interval; one stretch of GPU time may not hold them, so
a screening is resumable: run the perf tier again later (on the same or another host) and
merge the reports. The runs may screen different treatments against OFF (three OFF-ON runs
and one OFF-NATIVE run, where a GPU session holds two blocks a pair but not three): every
block pair of every input must hold OFF, the control its treatments are paired with. The
merge refuses, naming the file and the field, inputs that did not measure the same thing:
another perf schema, model digest, corpus (its digest where both screened the same sizes,
any request's payload sha256), engine (versions, chunk, KV geometry), engine flags (the
argv recorded per block, where both recorded it), replica placement (both replicas on one
GPU or one per GPU, where both recorded it), no size in common (a run that screened fewer
sizes, where its host dropped one, merges on the sizes both hold, said in a note); and an
input that is not whole block pairs with OFF. Blocks keep their own run: block and pair
numbers continue from the run before and ``perf.block_pairs`` says which blocks form each
pair, so ``perf.pairing`` pairs only
within one run's blocks, whatever each pair's size, and ``perf.runs`` says which blocks
came from which file, host and time. The tests, checks and notes of every input are kept
(a failure anywhere still fails ``compare``).

Exit status: 0 written, 2 a usage error or inputs that do not merge (one line, no
traceback).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from pytest_sharedkv.cli.compare.kernels import lmcache_of
from pytest_sharedkv.cli.compare.placement import placement_of
from pytest_sharedkv.cli.compare.reading import CompareError, Report, read_report
from pytest_sharedkv.cli.output import Output, OutputError, to_stdout
from pytest_sharedkv.perf.observations import (
    Floor,
    Observation,
    PerfRun,
    RunSource,
    SessionObservation,
    size_order,
    to_json,
)
from pytest_sharedkv.perf.pairing import (
    CONTROL,
    arm_pairs,
    blocks_per_pair,
    pair_arms,
    pair_layout,
)

PROG = "python -m pytest_sharedkv merge-screenings"
# The engine settings the perf tier records (``perf.engine_settings``, one per run: the
# flags every launched vLLM got; older reports lack them); every block's launched processes
# (``perf.launches``: argv and environment, with ports and paths that change from run to
# run) are only carried, never compared.
SETTINGS_FIELD = "engine_settings"
NOT_RECORDED = "engine flags not recorded"
RECORDED = "recorded"
# argv values that change from run to run without changing what is measured
VOLATILE = ("--port", "--host")


class MergeError(Exception):
    """Exit status 2: a usage error or inputs that do not merge."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise MergeError(f"{message}\n{self.format_usage().rstrip()}")


def sizes(run: PerfRun) -> list[str]:
    return sorted({o.size for o in run.observations if not o.warmup}, key=size_order)


def _flags(entry: object) -> str:
    """One block's recorded command line(s), with the values that differ per run masked."""
    text = json.dumps(entry, sort_keys=True)
    for name in VOLATILE:
        text = re.sub(rf'("{re.escape(name)}", )"[^"]*"', r'\1"*"', text)
    return text


def engine_flags(report: Report) -> list[str] | None:
    """The run's engine settings, or None where it recorded none."""
    perf = report.data.get("perf")
    value = perf.get(SETTINGS_FIELD) if isinstance(perf, dict) else None
    if not value:
        return None
    entries = value if isinstance(value, list) else [value]
    return sorted({_flags(e) for e in entries})


def _refuse(report: Report, field: str, mine: object, first: Report, theirs: object) -> NoReturn:
    raise MergeError(f"{report.path}: {field} differs from {first.path}: {mine!r} here, "
                     f"{theirs!r} there (a merge needs the same screening)")


def check_mergeable(first: Report, other: Report) -> None:
    """Raise MergeError naming OTHER's file and the field that differs from FIRST."""
    a, b = first.perf, other.perf
    assert a is not None and b is not None
    x, y = a.run, b.run
    x_sizes, y_sizes = sizes(x), sizes(y)
    for name in ("schema", "model_digest", "chunk_tokens"):
        if getattr(x, name) != getattr(y, name):
            _refuse(other, f"perf.{name}", getattr(y, name), first, getattr(x, name))
    # the corpus's digest covers every size it holds: where a run screened other sizes (a
    # size its host dropped), the sizes both screened are compared request by request below
    if x_sizes == y_sizes and x.corpus_digest != y.corpus_digest:
        _refuse(other, "perf.corpus_digest", y.corpus_digest, first, x.corpus_digest)
    for key in sorted(set(x.engine) | set(y.engine)):
        if x.engine.get(key) != y.engine.get(key):
            _refuse(other, f"perf.engine.{key}", y.engine.get(key), first, x.engine.get(key))
    placed, first_placed = placement_of(other), placement_of(first)
    if placed is not None and first_placed is not None \
            and placed.pair_gpus != first_placed.pair_gpus:  # one GPU vs one each
        _refuse(other, f"{placed.field} (replica placement)", placed.pair_gpus, first,
                first_placed.pair_gpus)
    mine, theirs = _kernel_path(first), _kernel_path(other)
    if mine is not None and theirs is not None and mine != theirs:  # compiled vs fallback
        _refuse(other, "environment.lmcache.kernel_path", theirs, first, mine)
    if not set(x_sizes) & set(y_sizes):
        _refuse(other, "perf.observations (sizes: none in common)", y_sizes, first, x_sizes)
    if (x.floor is None) != (y.floor is None):
        _refuse(other, "perf.floor", y.floor, first, x.floor)
    if x.floor is not None and y.floor is not None:
        for name in ("kv_bytes_per_token", "recurrent_bytes_per_sequence"):
            if getattr(x.floor, name) != getattr(y.floor, name):
                _refuse(other, f"perf.floor.{name}", getattr(y.floor, name), first,
                        getattr(x.floor, name))
        # an older report lacks the stored layout; two that both know it must agree
        xs, ys = x.floor.stored_bytes_per_token, y.floor.stored_bytes_per_token
        if xs is not None and ys is not None and xs != ys:
            _refuse(other, "perf.floor.stored_bytes_per_token", ys, first, xs)
    payloads = {(o.size, o.step, o.replica, o.request): o.payload_sha256
                for o in x.observations}
    for i, o in enumerate(y.observations):
        theirs = payloads.get((o.size, o.step, o.replica, o.request))
        if theirs is not None and theirs != o.payload_sha256:
            _refuse(other, f"perf.observations[{i}].payload_sha256 (corpus, request "
                    f"{o.request} {o.size} {o.step})", o.payload_sha256, first, theirs)
    flags, first_flags = engine_flags(other), engine_flags(first)
    if flags is not None and first_flags is not None and flags != first_flags:
        _refuse(other, f"perf.{SETTINGS_FIELD} (engine flags)", flags, first, first_flags)


def _kernel_path(report: Report) -> str | None:
    """LMCache's kernel path the run recorded (compiled, torch-fallback), None where it
    recorded none (an older report, no LMCache) or could not tell."""
    lmcache = lmcache_of(report)
    path = lmcache.get("kernel_path") if lmcache is not None else None
    return path if isinstance(path, str) and path != "unknown" else None


def layout(report: Report) -> list[int]:
    """Each block's pair in REPORT (recorded, or consecutive pairs of one size in a report
    written before ``block_pairs``); MergeError unless every pair is OFF and one block of
    each of its treatments, and every record lies in a block of its arm."""
    assert report.perf is not None
    run = report.perf.run
    blocks = run.blocks
    size = blocks_per_pair(blocks)
    if not blocks or (not run.block_pairs and len(blocks) % size):
        raise MergeError(f"{report.path}: perf.blocks: {len(blocks)} blocks "
                         f"({'-'.join(blocks) or 'none'}) are not whole block pairs of {size}")
    for pair, arms in pair_arms(blocks, run.block_pairs).items():
        if CONTROL not in arms:
            raise MergeError(f"{report.path}: perf.blocks: block pair {pair} "
                             f"({'-'.join(arms)}) holds no {CONTROL} block, the control its "
                             "treatments are paired with (a merge needs every pair to hold it)")
        if len(arms) < 2 or len(set(arms)) < len(arms):
            raise MergeError(f"{report.path}: perf.blocks: block pair {pair} "
                             f"({'-'.join(arms)}) is not a whole block pair ({CONTROL} and one "
                             "block of each treatment)")
    kept: tuple[tuple[str, Sequence[Observation | SessionObservation]], ...] = (
        ("observations", run.observations), ("sessions", run.sessions))
    for name, records in kept:
        for i, r in enumerate(records):
            arm = blocks[r.block] if 0 <= r.block < len(blocks) else None
            if r.arm != arm:
                raise MergeError(f"{report.path}: perf.{name}[{i}].arm: {r.arm!r} in block "
                                 f"{r.block}, which perf.blocks runs as {arm!r} (its blocks "
                                 "and records disagree)")
    return pair_layout(blocks, run.block_pairs)


def _host(report: Report) -> str:
    assert report.perf is not None
    environment = report.data.get("environment")
    host = environment.get("host") if isinstance(environment, dict) else None
    if isinstance(host, str) and host:
        return host
    return report.perf.run.engine.get("gpu", "unknown") + " (no host name recorded)"


def _sources(report: Report, first_block: int, first_pair: int, pairs: int
             ) -> list[RunSource]:
    """The runs REPORT (of PAIRS block pairs) holds, numbered from FIRST_BLOCK/FIRST_PAIR
    (a merged input keeps its own runs)."""
    assert report.perf is not None
    run = report.perf.run
    flags = RECORDED if engine_flags(report) is not None else NOT_RECORDED
    if run.runs:
        return [replace(r, first_block=r.first_block + first_block,
                        first_pair=r.first_pair + first_pair) for r in run.runs]
    return [RunSource(source=str(report.path), host=_host(report),
                      created=str(report.data.get("created", "")), first_block=first_block,
                      blocks=len(run.blocks), first_pair=first_pair, pairs=pairs,
                      wall_s=run.wall_s, engine_flags=flags)]


def _floor(runs: Sequence[PerfRun]) -> Floor | None:
    """The fastest host-to-device rate measured (the lowest floor: a cross TTFT below it
    came through no pool on any of the hosts)."""
    floors = [r.floor for r in runs if r.floor is not None]
    if not floors:
        return None
    best = max(floors, key=lambda f: f.h2d_gb_s)
    # the same model lays its KV out the same way: a run that recorded the stored layout
    # gives it to one (older) that did not (check_mergeable refused two that disagree)
    stored = next((f.stored_bytes_per_token for f in floors
                   if f.stored_bytes_per_token is not None), None)
    return replace(best, stored_bytes_per_token=stored,
                   source=f"{best.source}; the fastest of {len(floors)} runs' rates "
                          f"({', '.join(f'{f.h2d_gb_s:.1f}' for f in floors)} GB/s)")


def describe(run: RunSource, index: int, blocks: Sequence[str]) -> str:
    """One run of a merge: its file, host and time, and its blocks, pairs and arms (BLOCKS:
    the merged screening's)."""
    last_block, last_pair = run.first_block + run.blocks - 1, run.first_pair + run.pairs - 1
    arms = "-".join(blocks[run.first_block:last_block + 1])
    return (f"run {index + 1}: {run.source} ({run.host}, {run.created}): blocks "
            f"{run.first_block}-{last_block}, block pairs {run.first_pair}-{last_pair}, "
            f"arms {arms}, {run.wall_s:.1f} s; {run.engine_flags}")


def _sizes_note(merged: PerfRun) -> list[str]:
    """Where the runs screened different sizes (a host that dropped one): which runs hold
    each size that not all of them hold (a size's ratios use the block pairs that screened
    it)."""
    held = []
    for run in merged.runs:
        blocks = range(run.first_block, run.first_block + run.blocks)
        held.append({o.size for o in merged.observations if o.block in blocks and not o.warmup})
    every = set.intersection(*held) if held else set()
    partial = sorted(set().union(*held) - every, key=size_order)
    if not partial:
        return []
    return ["sizes differ between runs: " + "; ".join(
        f"{size} in run{'s' if sum(size in h for h in held) != 1 else ''} "
        + ", ".join(str(i + 1) for i, h in enumerate(held) if size in h)
        for size in partial) + "; each size's ratios use the block pairs that screened it"]


def _arms_note(merged: PerfRun) -> list[str]:
    """Where the runs screened different treatments: how many block pairs each has (a
    treatment's ratios use its own pairs only)."""
    pairs = {arm: n for arm, n in arm_pairs(merged.blocks, merged.block_pairs).items()
             if arm != CONTROL}
    layouts = {"-".join(sorted(set(merged.blocks[r.first_block:r.first_block + r.blocks])))
               for r in merged.runs}
    if len(layouts) < 2:
        return []
    return ["treatment arms differ between runs: " + ", ".join(
        f"{arm} in {n} block pair{'s' if n != 1 else ''}" for arm, n in pairs.items())
        + f"; each is paired with {CONTROL} of its own pairs"]


@dataclass(frozen=True)
class RunIdentity:
    """One run an input holds, known by what it measured: its observations and sessions
    (numbered from its own first block and pair, so a run reads the same alone and inside
    a merge); its report's creation time is said beside it."""

    given: int  # the input's place among IN.json (from 1)
    path: Path  # that input
    run: int | None  # its place among a merged input's runs (None: the input is one run)
    source: str  # the file it came from (a merged input's perf.runs[].source)
    created: str
    records: int  # its observations and sessions
    digest: str  # sha256 of them

    def __str__(self) -> str:
        where = f"IN.json #{self.given} {self.path}"
        if self.run is not None:
            where = f"run {self.run + 1} of {where} (from {self.source})"
        return f"{where}, created {self.created or '(not recorded)'}"


def _digest(records: Sequence[Observation | SessionObservation], block: int, pair: int) -> str:
    rows = [{**asdict(r), "block": r.block - block, "pair": r.pair - pair} for r in records]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def identities(report: Report, given: int) -> list[RunIdentity]:
    """The runs REPORT (IN.json #GIVEN) holds: one, or each of a merged report's runs."""
    assert report.perf is not None
    run = report.perf.run
    sources = run.runs or [RunSource(str(report.path), "", str(report.data.get("created", "")),
                                     0, len(run.blocks), 0, 0, run.wall_s, "")]
    out = []
    for index, source in enumerate(sources):
        blocks = range(source.first_block, source.first_block + source.blocks)
        mine: list[Observation | SessionObservation] = [
            *(o for o in run.observations if o.block in blocks),
            *(s for s in run.sessions if s.block in blocks)]
        out.append(RunIdentity(given, report.path, index if run.runs else None, source.source,
                               source.created, len(mine),
                               _digest(mine, source.first_block, source.first_pair)))
    return out


def refuse_repeats(reports: Sequence[Report]) -> None:
    """MergeError naming both files where one run is given twice (the same file, a copy
    under another name, or a run a merged input already holds): its block pairs would
    count twice, and an interval over copies is as narrow as it is false."""
    seen: dict[str, RunIdentity] = {}
    for given, report in enumerate(reports, start=1):
        for mine in identities(report, given):
            if not mine.records:
                continue  # a run that measured nothing adds no pair to count twice
            first = seen.setdefault(mine.digest, mine)
            if first is not mine:
                raise MergeError(
                    f"{mine.path}: the same run twice: {mine} holds the same {mine.records} "
                    f"observations and sessions as {first} (sha256 {mine.digest[:16]}); "
                    "merged, its block pairs would count twice")


def merge_runs(reports: Sequence[Report]) -> PerfRun:
    """One screening of every report's blocks, numbered on; MergeError where they differ."""
    layouts = []
    for report in reports:
        if report.perf is None:
            raise MergeError(f"{report.path}: perf: the report holds no perf screening (run "
                             "the perf tier: -m perf)")
        layouts.append(layout(report))
    first = reports[0]
    for other in reports[1:]:
        check_mergeable(first, other)
    refuse_repeats(reports)
    runs = [r.perf.run for r in reports if r.perf is not None]
    merged = PerfRun(schema=runs[0].schema, model_digest=runs[0].model_digest,
                     corpus_digest=runs[0].corpus_digest, engine=dict(runs[0].engine),
                     blocks=[], floor=_floor(runs), chunk_tokens=runs[0].chunk_tokens,
                     # the runs' placement (check_mergeable refused two that differ); a
                     # run that recorded it gives it to one (older) that did not
                     replica_placement=next((r.replica_placement for r in runs
                                             if r.replica_placement is not None), None),
                     # the same in every run (the settings: check_mergeable compared them)
                     model=dict(runs[0].model),
                     engine_settings=dict(runs[0].engine_settings),
                     # each block's launch, where every run kept one entry a block (older
                     # reports did not: then none, never a list that names the wrong block)
                     launches=[dict(x) for r in runs for x in r.launches]
                     if all(len(r.launches) == len(r.blocks) for r in runs) else [])
    for report, run, pairs in zip(reports, runs, layouts, strict=True):
        block = len(merged.blocks)
        pair = merged.block_pairs[-1] + 1 if merged.block_pairs else 0
        merged.block_pairs += [p + pair for p in pairs]
        sources = _sources(report, block, pair, len(set(pairs)))
        merged.observations += [replace(o, block=o.block + block, pair=o.pair + pair)
                                for o in run.observations]
        merged.sessions += [replace(s, block=s.block + block, pair=s.pair + pair)
                            for s in run.sessions]
        merged.blocks += run.blocks
        merged.restarts_s += run.restarts_s
        merged.wall_s += run.wall_s
        if run.runs:  # a merged input: its notes already say which run they are from
            merged.notes += [n for n in run.notes if not n.startswith("merged from ")]
        else:
            merged.notes += [f"run {len(merged.runs) + 1}: {note}" for note in run.notes]
        merged.runs += sources
    flags = {r.engine_flags for r in merged.runs}
    merged.notes = [f"merged from {len(merged.runs)} separate runs: "
                    + "; ".join(describe(r, i, merged.blocks)
                                for i, r in enumerate(merged.runs)),
                    *_arms_note(merged),
                    *_sizes_note(merged),
                    *([f"{NOT_RECORDED} in every run, so they were not compared"]
                      if flags == {NOT_RECORDED} else
                      [f"{NOT_RECORDED} in some runs, so they were compared only where "
                       "recorded"] if NOT_RECORDED in flags else []),
                    *merged.notes]
    return merged


def merge_reports(reports: Sequence[Report]) -> dict[str, Any]:
    """The merged sharedkv JSON report: the first input's header, every input's tests,
    checks, notes and collection, and the merged screening under ``"perf"``."""
    out = dict(reports[0].data)
    perf = merge_runs(reports)
    for name in ("tests", "collection", "checks", "notes"):
        out[name] = [entry for r in reports for entry in r.data.get(name, [])]
    summary: dict[str, int] = {}
    for r in reports:
        for key, value in (r.data.get("summary") or {}).items():
            if isinstance(value, int):
                summary[key] = summary.get(key, 0) + value
    out["summary"] = summary
    out["complete"] = all(r.data.get("complete", True) for r in reports)
    out["interrupted"] = any(r.data.get("interrupted", False) for r in reports)
    statuses = [r.data.get("exitstatus", 0) for r in reports]
    out["exitstatus"] = max((s for s in statuses if isinstance(s, int)), default=0)
    out["perf"] = to_json(perf)
    return out


def main(argv: Sequence[str]) -> int:
    import sys

    parser = _Parser(prog=PROG, description="Merge perf screenings of separate runs (the same "
                     "model, corpus and engine; each block pair holding OFF, its treatments "
                     "ON, NATIVE or both) into one report, block pairs numbered on, so that "
                     "enough pairs for an interval can span several runs.")
    parser.add_argument("out", type=Path, metavar="OUT.json", help="the merged report")
    parser.add_argument("inputs", type=Path, nargs="+", metavar="IN.json",
                        help="the reports to merge, in the order they ran (two or more)")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT.json if it exists (never an input, under any name)")
    try:
        args = parser.parse_args(list(argv))
        if len(args.inputs) < 2:
            raise MergeError("merge-screenings needs two or more IN.json reports")
        out = Output(args.out, "OUT.json", args.force,
                     [(f"IN.json #{i + 1}", p) for i, p in enumerate(args.inputs)])
        out.check()  # before any work: nothing is read only to be refused
        try:
            reports = [read_report(path) for path in args.inputs]
        except CompareError as exc:
            raise MergeError(str(exc)) from None
        merged = merge_reports(reports)
        out.write(json.dumps(merged, indent=1) + "\n")
    except (MergeError, OutputError) as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
    from pytest_sharedkv.perf.observations import from_json
    from pytest_sharedkv.perf.statistics import analyse
    from pytest_sharedkv.perf.tables import report_lines

    tables = report_lines(analyse(from_json(merged["perf"])))
    try:
        to_stdout("\n".join([f"{args.out}: {merged['perf']['notes'][0]}", "", *tables]) + "\n")
    except OutputError as exc:  # the merge is written; its tables could not be shown
        sys.stderr.write(f"{PROG}: {args.out} written, but {exc}\n")
        return 2
    return 0
