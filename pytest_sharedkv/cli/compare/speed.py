"""Perf verdicts: per cell the median before and after, the relative change and whether
the block pairs tell it from noise (Welch's t on their medians, one-sided)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from pytest_sharedkv.perf.observations import arm_order
from pytest_sharedkv.perf.significance import MIN_PAIRS, Welch, welch
from pytest_sharedkv.perf.statistics import Analysis
from pytest_sharedkv.perf.tables import behind, seconds


@dataclass(frozen=True)
class Stat:
    median: float
    n: int
    pairs: int
    per_pair: tuple[float, ...] = ()  # the cell's median in each block pair

    def __str__(self) -> str:
        return f"{seconds(self.median)} ({behind(self.n, self.pairs)})"


class Verdict(Enum):
    """A cell's verdict: what the RESULT line, the exit status and the table act on; its
    words are rendered from it (``Change.verdict``)."""

    OK = "ok"  # within the limit
    MISSING = "MISSING in AFTER"
    NEW = "new in AFTER"
    REGRESSION = "REGRESSION"  # slower beyond the limit and beyond the noise
    FASTER = "faster"  # faster beyond the limit and beyond the noise
    WITHIN_NOISE = "within noise"  # beyond the limit; the block pairs cannot tell it
    NOT_JUDGED = "not judged"  # beyond the limit; too few block pairs for the t-test


JUDGED = (Verdict.REGRESSION, Verdict.FASTER)  # beyond the limit and the noise
FAILING = (Verdict.REGRESSION, Verdict.MISSING)


@dataclass(frozen=True)
class Change:
    what: tuple[str, ...]  # (size, arm, step) or (arm, placement)
    before: Stat | None
    after: Stat | None

    @property
    def relative(self) -> float | None:
        if self.before is None or self.after is None or self.before.median <= 0:
            return None
        return self.after.median / self.before.median - 1

    def test(self) -> Welch | None:
        """Welch's t on the per-pair medians, or None where it cannot run (a side with
        fewer than ``MIN_PAIRS`` block pairs, or a per-pair median that is not positive)."""
        if self.before is None or self.after is None:
            return None
        if min(self.before.per_pair + self.after.per_pair, default=0.0) <= 0:
            return None
        return welch(self.before.per_pair, self.after.per_pair)

    def significant(self, test: Welch) -> bool:
        """One-sided, in the direction of the median change: a slower median whose t says
        AFTER is faster (or is small) is not a regression."""
        change = self.relative
        if not change:
            return False
        return test.shows(slower=change > 0)

    def beyond(self, limit: float) -> bool:
        """Changed by more than LIMIT either way (judged or not)."""
        change = self.relative
        return change is not None and abs(change) > limit

    def judge(self, limit: float) -> Verdict:
        """OK; REGRESSION or FASTER (beyond LIMIT and beyond the noise); WITHIN_NOISE or
        NOT_JUDGED (beyond LIMIT, the block pairs cannot tell it or are too few)."""
        if self.after is None:
            return Verdict.MISSING
        if self.before is None:
            return Verdict.NEW
        change = self.relative
        if change is None or not self.beyond(limit):
            return Verdict.OK
        test = self.test()
        if test is None:
            return Verdict.NOT_JUDGED
        if not self.significant(test):
            return Verdict.WITHIN_NOISE
        return Verdict.REGRESSION if change > 0 else Verdict.FASTER

    def direction(self) -> str:
        """"slower +12.0%" or "faster -12.0%" ("" where there is no change to tell)."""
        change = self.relative
        return "" if change is None else f"{'slower' if change > 0 else 'faster'} {change:+.1%}"

    def verdict(self, limit: float) -> str:
        """The verdict in words: ``judge``'s, with the change and the evidence where the
        block pairs could not judge it."""
        verdict = self.judge(limit)
        if verdict is Verdict.NOT_JUDGED:
            assert self.before is not None and self.after is not None
            return (f"{self.direction()}, not judged: BEFORE {self.before.pairs}, AFTER "
                    f"{self.after.pairs} block pairs (the t-test needs >= {MIN_PAIRS} on "
                    "each side)")
        if verdict is Verdict.WITHIN_NOISE:
            test = self.test()
            assert test is not None and self.relative is not None
            return f"{self.direction()}, within noise " \
                f"({test.describe(slower=self.relative > 0)})"
        return str(verdict.value)

    def failed(self, limit: float) -> bool:
        return self.judge(limit) in FAILING

    def not_judged(self, limit: float) -> bool:
        """Beyond LIMIT, and the t-test cannot run (too few block pairs on a side)."""
        return self.judge(limit) is Verdict.NOT_JUDGED

    def within_noise(self, limit: float) -> bool:
        """Beyond LIMIT, and the t-test ran and cannot tell the change from noise."""
        return self.judge(limit) is Verdict.WITHIN_NOISE


def _changes(before: dict[tuple[str, ...], Stat], after: dict[tuple[str, ...], Stat]
             ) -> list[Change]:
    keys = list(before) + [k for k in after if k not in before]
    return [Change(k, before.get(k), after.get(k)) for k in keys]


def ttft_changes(before: Analysis, after: Analysis) -> list[Change]:
    def stats(a: Analysis) -> dict[tuple[str, ...], Stat]:
        return {(c.size, c.arm, c.step): Stat(
            c.median_ttft_s, c.n, c.block_pairs, c.per_pair_ttft_s) for c in a.cells}

    return _changes(stats(before), stats(after))


def session_changes(before: Analysis, after: Analysis) -> list[Change]:
    def stats(a: Analysis) -> dict[tuple[str, ...], Stat]:
        return {(c.arm, c.placement): Stat(
            c.median_wall_s, c.n, c.block_pairs, c.per_pair_wall_s) for c in a.session_cells}

    return _changes(stats(before), stats(after))


def arms(analysis: Analysis) -> set[str]:
    """The arms a screening ran: its blocks' (a cell's arm where none were recorded)."""
    return set(analysis.run.blocks) or {c.arm for c in analysis.cells} | {
        c.arm for c in analysis.session_cells}


def shared_arms(before: Analysis, after: Analysis) -> set[str]:
    """The arms both screenings ran: the only ones compared (a treatment one side did not
    screen is a choice of what to run, not a lost cell)."""
    return arms(before) & arms(after)


def arms_line(before: Analysis | None, after: Analysis | None) -> str:
    """ARMS DIFFER: the arms only one side screened, with their block pairs; "" where both
    ran the same arms."""
    if before is None or after is None:
        return ""
    shared = shared_arms(before, after)
    only = []
    for side, mine in (("BEFORE", before), ("AFTER", after)):
        pairs = mine.arm_pairs
        for arm in sorted(arms(mine) - shared, key=arm_order):
            n = pairs.get(arm)
            only.append(f"{arm} only in {side}" + (
                "" if n is None else f" ({n} block pair{'s' if n != 1 else ''})"))
    if not only:
        return ""
    judged = ", ".join(sorted(shared, key=arm_order)) or "none"
    return (f"ARMS DIFFER: {'; '.join(only)}: their cells are not compared; judged: the "
            f"arms both screened ({judged})")


def changes(before: Analysis | None, after: Analysis | None
            ) -> tuple[list[Change], list[Change]]:
    """(TTFT changes, session wall-time changes) of the arms both screened; none unless
    both hold a screening."""
    if before is None or after is None:
        return [], []
    shared = shared_arms(before, after)
    return ([c for c in ttft_changes(before, after) if c.what[1] in shared],
            [c for c in session_changes(before, after) if c.what[0] in shared])


def regressions(changes: Sequence[Change], limit: float) -> list[Change]:
    """The cells slower than LIMIT beyond the noise of their block pairs."""
    return [c for c in changes if c.judge(limit) is Verdict.REGRESSION]


def missing(changes: Sequence[Change]) -> list[Change]:
    """The cells BEFORE has and AFTER lacks."""
    return [c for c in changes if c.after is None]
