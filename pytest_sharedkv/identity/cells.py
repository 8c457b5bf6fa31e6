"""One identity pair run and recorded: the cell's two sides on its stack, judged
(``judge``), each side a ``Check`` of the tier (kind and status: what verdicts read), and
what the test does with it (pass, fail naming the dimension, VOID, skip with the reason).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_sharedkv.identity.judge import SideResult, Verdict, judge, pair_status
from pytest_sharedkv.identity.table import Dimension, IdentityCell, IdentityStack, Side
from pytest_sharedkv.report.records import Status

if TYPE_CHECKING:
    from pytest_sharedkv.report.records import ResultSink
    from pytest_sharedkv.stack.checks.identity_transfer import Observed
    from pytest_sharedkv.stack.faults import LaunchFaults

TIER = "identity"
NO_RELEASE_SITE = ("the two-release cells need a second LMCache release in a site of its "
                   "own: give --sharedkv-identity-release-site DIR (made by `pip install "
                   "--no-deps --target DIR lmcache==0.5.7rc2`)")


@dataclass
class CellOutcome:
    """What the test says: a failure (the verdicts' messages), VOID, or a skip."""

    failures: list[str] = field(default_factory=list)
    void: list[str] = field(default_factory=list)
    skip: str = ""


@dataclass(frozen=True)
class Inputs:
    """What a cell runs with: where it logs, the tenant's salt, the planted faults, the
    real server's observations (run once for the session, on first use), the release
    site."""

    log_dir: Path
    salt: str
    faults: LaunchFaults
    transfer: Callable[[], Observed]
    release_site: Path | None = None


def _record(sink: ResultSink, cell: IdentityCell, verdicts: tuple[Verdict, Verdict],
            results: tuple[SideResult, SideResult], outcome: CellOutcome,
            direction: str = "", word: str = "",
            servers: dict[str, str] | None = None) -> None:
    for verdict, result in zip(verdicts, results, strict=True):
        key = {**cell.key(), "side": str(result.side)}
        if direction:
            key["direction"] = direction
        counted = verdict.status in (Status.PASS, Status.FAIL)
        sink.check(TIER, key, int(verdict.status is Status.PASS), int(counted),
                   message=verdict.message[:500], kind=verdict.kind, status=verdict.status,
                   detail={"hit_tokens": result.hit, "exact": result.exact,
                           "detail": result.detail[:300], "error": result.error[:500],
                           "cold_hit_tokens": result.cold_hit,
                           **({"direction_verdict": word}
                              if word and result.side is Side.OTHER else {}),
                           **({"servers": servers} if servers else {})})
    status = pair_status(verdicts)
    where = f"{cell.id}" + (f" ({direction})" if direction else "")
    messages = [v.message for v in verdicts if v.status is status]
    if status is Status.FAIL:
        outcome.failures += [f"{where}: {m}" for m in messages]
    elif status in (Status.VOID, Status.UNKNOWN):
        outcome.void += [f"{where}: {m}" for m in messages]


def run_cell(cell: IdentityCell, inputs: Inputs, sink: ResultSink) -> CellOutcome:
    outcome = CellOutcome()
    if not cell.reach.runs:
        outcome.skip = f"{cell.dimension} on {cell.stack}: {cell.reach.skip}"
        return outcome
    if cell.stack is IdentityStack.STUB:
        from pytest_sharedkv.identity import stub_cells

        run = stub_cells.run(cell.dimension, inputs.log_dir, inputs.salt, inputs.faults.stub)
        results = (run.same, run.other)
        _record(sink, cell, judge(cell.dimension, *results), results, outcome)
        return outcome
    from pytest_sharedkv.identity import transfer_cells

    if cell.dimension is Dimension.RELEASE:
        if inputs.release_site is None:
            outcome.skip = f"{cell.dimension} on {cell.stack}: {NO_RELEASE_SITE}"
            return outcome
        from pytest_sharedkv.stack.checks.identity_transfer import run_releases

        observed = run_releases(inputs.log_dir, inputs.salt, inputs.release_site)
        for direction in transfer_cells.DIRECTIONS:
            results = transfer_cells.direction_sides(observed, direction)
            _record(sink, cell, judge(cell.dimension, *results), results, outcome,
                    direction, transfer_cells.direction_word(results[1]), observed.servers)
        return outcome
    observed = inputs.transfer()
    results = transfer_cells.sides(observed, cell.dimension)
    _record(sink, cell, judge(cell.dimension, *results), results, outcome,
            servers=observed.servers)
    return outcome
