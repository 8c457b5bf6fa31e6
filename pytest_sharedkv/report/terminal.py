"""The terminal summary: one section per tier, tables users can paste into an issue.

Each tier names which record keys make the rows and which one (if any) spreads into
columns, like a paper's table: method x direction x size -> passed/trials per delay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pytest_sharedkv.config.markers import TIER_MARKERS
from pytest_sharedkv.report.markdown import markdown_table
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.run_log import RunLog, TestResult

H = TypeVar("H", bound=Hashable)


@dataclass(frozen=True)
class TableSpec:
    rows: tuple[str, ...]
    column: str | None = None
    column_label: str = ""
    numeric_columns: bool = False  # order columns by value (delay 0 before 1e8)


@dataclass(frozen=True)
class TierReport:
    """What a tier adds to the summary, handed over through ``pytest_sharedkv_tier_report``
    so that this module imports no tier: how its table is laid out (``table``; None makes
    one from the records' keys), whether its own lines replace that table, and the lines it
    computes from every worker's records."""

    tier: str
    table: TableSpec | None = None
    own_table: bool = False
    lines: Callable[[RunLog], list[str]] | None = None


def _ordered_unique(values: Iterable[H]) -> list[H]:
    return list(dict.fromkeys(values))


def check_table(checks: Sequence[Check], spec: TableSpec | None) -> list[str]:
    if not checks:
        return []
    if spec is None:
        keys = _ordered_unique(k for c in checks for k in c.key)
        spec = TableSpec(rows=tuple(keys))
    row_keys = [k for k in spec.rows if any(k in c.key or k == "role" for c in checks)]

    def row_of(c: Check) -> tuple[str, ...]:
        return tuple(c.role if k == "role" and "role" not in c.key else c.key.get(k, "")
                     for k in row_keys)

    columns = (
        _ordered_unique(c.key.get(spec.column, "") for c in checks) if spec.column else [""]
    )
    if spec.numeric_columns:
        columns.sort(key=_as_number)
    cells: dict[tuple[tuple[str, ...], str], list[int]] = {}
    status: dict[tuple[tuple[str, ...], str], str] = {}
    for c in checks:
        col = c.key.get(spec.column, "") if spec.column else ""
        total = cells.setdefault((row_of(c), col), [0, 0])
        total[0] += c.passed
        total[1] += c.trials
        if c.trials == 0 and c.status not in ("pass", "fail"):  # xfail, void, unproven ...
            status[(row_of(c), col)] = c.status

    def cell(row: tuple[str, ...], col: str) -> str:
        if (row, col) not in cells:
            return "-"
        passed, trials = cells[(row, col)]
        return status.get((row, col), "n/a") if trials == 0 else f"{passed}/{trials}"

    rows = [[*row, *(cell(row, col) for col in columns)]
            for row in _ordered_unique(row_of(c) for c in checks)]
    header = [*row_keys, *(
        f"{spec.column_label}{col}" if spec.column else "passed/trials" for col in columns
    )]
    return markdown_table(header, rows)


def _as_number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("inf")


def _counts_line(counts: dict[str, int]) -> str:
    """pytest's words: '2 passed, 1 failed, 1 error' (and 'errors' for more than one)."""
    parts = [f"{n} {'error' if name == 'errors' and n == 1 else name}"
             for name, n in counts.items() if n]
    return ", ".join(parts) or "none finished"


def _reason_lines(results: Sequence[TestResult]) -> list[str]:
    """Why tests did not pass, grouped: skips, gated skips failed on purpose, errors."""
    groups = (
        ("skipped", [r.message for r in results if r.outcome == "skipped"]),
        ("failed under --sharedkv-require-gpu",
         [r.message for r in results if r.outcome == "failed" and r.require_gpu]),
        ("error", [r.message for r in results if r.outcome == "error"]),
    )
    lines = []
    for label, messages in groups:
        for reason, n in Counter(messages).most_common():
            lines.append(f"  {label} ({n}): {reason}")
    unfinished = [r.nodeid for r in results if r.outcome is None]
    if unfinished:
        shown = ", ".join(unfinished[:5]) + (", ..." if len(unfinished) > 5 else "")
        lines.append(f"  no outcome ({len(unfinished)}): {shown}")
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_lines(log: RunLog, reports: Mapping[str, TierReport] | None = None) -> list[str]:
    reports = reports or {}
    lines: list[str] = []
    tiers = [t for t in TIER_MARKERS if any(r.tier == t for r in log.tests.values())]
    tiers += [t for t in _ordered_unique(c.tier for c in log.bundle.checks) if t not in tiers]
    if tiers and log.interrupted is not None:
        unfinished = [r for r in log.unfinished() if r.tier is not None]
        lines.append(f"INTERRUPTED ({log.interrupted}): {_plural(len(unfinished), 'test')} "
                     f"{'has' if len(unfinished) == 1 else 'have'} no outcome; the counts "
                     "below cover what finished")
        lines.append("")
    for tier in tiers:
        results = [r for r in log.tests.values() if r.tier == tier]
        lines.append(f"[{tier}] tests: {_counts_line(log.counts(tier))}")
        lines.extend(_reason_lines(results))
        wall = log.wall_s(tier)
        if wall is not None:
            lines.append(f"  wall time: {wall:.1f} s (first test start to last test end)")
        checks = [c for c in log.bundle.checks if c.tier == tier]
        report = reports.get(tier, TierReport(tier))
        table = [] if report.own_table else check_table(checks, report.table)
        if table:
            lines.append("")
            lines.extend(table)
        notes = [n for n in log.bundle.notes if n.tier == tier]
        if notes:
            lines.append("")
        for note in _ordered_unique(f"{n.level.upper()}: {n.text}" if n.level != "info"
                                    else n.text for n in notes):
            lines.append(f"  {note}")
        if report.lines is not None:
            tier_lines = report.lines(log)
            if tier_lines and not notes:
                lines.append("")
            lines.extend(f"  {line}" for line in tier_lines)
        lines.append("")
    facts = _ordered_unique(f"{f.name}: {f.value}" for f in log.bundle.facts)
    if facts:
        lines.append("environment as the tests saw it:")
        lines.extend(f"  {f}" for f in facts)
    if tiers:
        if facts:
            lines.append("")
        lines.append(verdict_line(log))
    return lines


FAILED = ("failed", "error")


def verdict(log: RunLog) -> str:
    """The run's one word, from outcomes and records: INCOMPLETE when the run stopped early
    or a test has no outcome; FAIL when a test failed or errored other than on a VOID
    record (or a module failed to collect); VOID when a record says its result proves
    nothing; else PASS (skips and xfails included)."""
    if log.interrupted is not None or log.unfinished():
        return "INCOMPLETE"
    void = {c.nodeid for c in log.bundle.checks if c.void}
    failed = {r.nodeid for r in log.tests.values() if r.outcome in FAILED}
    if failed - void or any(category in FAILED for _, category, _ in log.collection):
        return "FAIL"
    return "VOID" if void else "PASS"


def verdict_line(log: RunLog) -> str:
    word = verdict(log)
    line = f"sharedkv: {word} \N{EM DASH} {_counts_line(log.counts())}"
    if word == "INCOMPLETE":
        why = log.interrupted or "the run stopped under them"
        line += f"; {_plural(len(log.unfinished()), 'test')} without an outcome ({why})"
    elif word == "VOID":
        void = {c.nodeid for c in log.bundle.checks if c.void}
        line += f"; {_plural(len(void), 'test')} recorded a result that proves nothing (VOID)"
    return line
