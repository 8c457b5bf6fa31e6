"""Numbers from a screening: per cell (size x arm x step) the median TTFT over every
observation, and per block pair the paired ratio (the median over the pair's requests of
ON/OFF). The block pair is the independent unit: an interval resamples block pairs, never
requests, and with fewer than three pairs there is none (the text says so). A pair whose
observations repeat an earlier pair's (the same run given twice, a copy) is no independent
unit: it counts once, so a copy cannot narrow an interval or make one where there is none.

Plain ``statistics`` and ``random.Random(seed)``: the same data and seed give the same
interval on every machine, and nothing heavy is imported.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field, replace
from functools import cached_property

from pytest_sharedkv.perf.observations import (
    PLACEMENTS,
    STEPS,
    Observation,
    PerfRun,
    SessionObservation,
    arm_order,
    size_order,
)
from pytest_sharedkv.perf.pairing import (
    CONTROL,
    PairedRequest,
    Pairing,
    arm_pairs,
    pair_run,
)

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
MIN_PAIRS = 3  # an interval over fewer block pairs says nothing


Repeats = tuple[tuple[int, int], ...]  # (a block pair, the earlier pair whose data it repeats)


def no_interval(pairs: int) -> str:
    return f"no interval: {pairs} block pairs (an interval needs >= {MIN_PAIRS})"


def repeats_text(repeats: Repeats) -> str:
    """Which block pairs repeat another's observations and were counted once ("" none)."""
    by_first: dict[int, list[int]] = defaultdict(list)
    for pair, first in repeats:
        by_first[first].append(pair)
    return "".join(f"; {'pairs' if len(ps) > 1 else 'pair'} {', '.join(map(str, ps))} "
                   f"{'repeat' if len(ps) > 1 else 'repeats'} pair {first}'s observations, "
                   "counted once" for first, ps in sorted(by_first.items()))


def _content(records: Iterable[Observation | SessionObservation]) -> tuple[str, ...]:
    """What RECORDS measured, whatever block and pair they were numbered in."""
    return tuple(sorted(repr(astuple(replace(r, block=0, pair=0))) for r in records))


def _by_pair(records: Iterable[Observation | SessionObservation]
             ) -> dict[int, list[Observation | SessionObservation]]:
    grouped: dict[int, list[Observation | SessionObservation]] = defaultdict(list)
    for r in records:
        grouped[r.pair].append(r)
    return grouped


def independent(groups: Mapping[int, Iterable[Observation | SessionObservation]]
                ) -> tuple[list[int], Repeats]:
    """The block pairs of GROUPS (pair -> what it measured), in pair order, whose data no
    earlier pair holds too; and each pair that repeats an earlier one's, with that pair."""
    first: dict[tuple[str, ...], int] = {}
    kept, repeats = [], []
    for pair in sorted(groups):
        seen = first.setdefault(_content(groups[pair]), pair)
        if seen == pair:
            kept.append(pair)
        else:
            repeats.append((pair, seen))
    return kept, tuple(repeats)


def _step_order(step: str) -> int:
    return STEPS.index(step) if step in STEPS else len(STEPS)


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval over block pairs."""

    low: float
    high: float
    confidence: float
    resamples: int
    seed: int

    def __str__(self) -> str:
        return f"{self.confidence:.0%} interval {self.low:.3f}-{self.high:.3f}"


def bootstrap_interval(values: Sequence[float], *, confidence: float = CONFIDENCE,
                       resamples: int = RESAMPLES, seed: int = SEED,
                       statistic: Callable[[Sequence[float]], float] = statistics.median,
                       ) -> Interval | None:
    """The percentile bootstrap interval of STATISTIC over VALUES (one per block pair),
    or None with fewer than ``MIN_PAIRS`` values."""
    if len(values) < MIN_PAIRS:
        return None
    if not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"confidence must lie in (0, 1) and resamples be >= 1, not "
                         f"{confidence}, {resamples}")
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(statistic([values[rng.randrange(n)] for _ in range(n)])
                   for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = stats[min(resamples - 1, int(tail * resamples))]
    high = stats[max(0, min(resamples - 1, int((1 - tail) * resamples + 0.5) - 1))]
    return Interval(low, high, confidence, resamples, seed)


@dataclass(frozen=True)
class Cell:
    """Every measured observation of one size x arm x step."""

    size: str
    arm: str
    step: str
    observations: tuple[Observation, ...]

    @property
    def n(self) -> int:
        return len(self.observations)

    @property
    def block_pairs(self) -> int:
        """The independent block pairs behind the cell (a repeat counts once)."""
        return len(self.per_pair_ttft_s)

    @property
    def median_ttft_s(self) -> float:
        return statistics.median(o.ttft_s for o in self.observations)

    @property
    def median_decode_tok_s(self) -> float | None:
        rates = [o.decode_tok_s for o in self.observations if o.decode_tok_s is not None]
        return statistics.median(rates) if rates else None

    @property
    def median_prompt_tokens(self) -> float:
        return statistics.median(o.prompt_tokens for o in self.observations)

    @cached_property
    def per_pair_ttft_s(self) -> tuple[float, ...]:
        """The median TTFT in each independent block pair, in pair order (what significance
        tests: a repeated pair would fake a spread of zero)."""
        kept, _ = independent(_by_pair(self.observations))
        return tuple(m for p, m in pair_medians((o.pair, o.ttft_s) for o in self.observations)
                     if p in kept)


def measured(observations: Iterable[Observation]) -> list[Observation]:
    """Warm-ups stay in the data and out of every number."""
    return [o for o in observations if not o.warmup]


def cells(observations: Iterable[Observation]) -> list[Cell]:
    groups: dict[tuple[str, str, str], list[Observation]] = defaultdict(list)
    for o in measured(observations):
        groups[(o.size, o.arm, o.step)].append(o)
    order = sorted(groups, key=lambda k: (size_order(k[0]), arm_order(k[1]),
                                          _step_order(k[2])))
    return [Cell(*key, tuple(groups[key])) for key in order]


@dataclass(frozen=True)
class PairedRatio:
    """treatment/control TTFT of one size x step: one ratio per block pair (the median over
    that pair's requests), their median, and an interval where there are enough pairs."""

    size: str
    step: str
    arms: str  # "ON/OFF"
    per_pair: tuple[tuple[int, float], ...]  # the independent pairs only
    requests: int
    interval: Interval | None
    repeats: Repeats = ()  # pairs left out: their observations repeat an earlier pair's

    @property
    def block_pairs(self) -> int:
        """The independent block pairs behind the ratio (a repeat counts once)."""
        return len(self.per_pair)

    @property
    def treatment(self) -> str:
        """The arm over OFF ("ON" of "ON/OFF")."""
        return self.arms.split("/")[0]

    @property
    def median(self) -> float:
        return statistics.median(r for _, r in self.per_pair)

    @property
    def spread(self) -> str:
        """The interval, or why there is none; and the pairs counted once."""
        return (str(self.interval) if self.interval else no_interval(self.block_pairs)) + \
            repeats_text(self.repeats)


def _per_pair(values: dict[int, list[float]]) -> tuple[tuple[int, float], ...]:
    return tuple((pair, statistics.median(v)) for pair, v in sorted(values.items()))


def pair_medians(items: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """(pair, median) for each block pair among (pair, value) ITEMS, in pair order."""
    grouped: dict[int, list[float]] = defaultdict(list)
    for pair, value in items:
        grouped[pair].append(value)
    return _per_pair(grouped)


def paired_ratios(pairs: Sequence[PairedRequest], *, confidence: float = CONFIDENCE,
                  resamples: int = RESAMPLES, seed: int = SEED) -> list[PairedRatio]:
    groups: dict[tuple[str, str, str], dict[int, list[PairedRequest]]] = defaultdict(
        lambda: defaultdict(list))
    for p in pairs:
        groups[(p.size, p.step, p.arms)][p.pair].append(p)
    out = []
    for key in sorted(groups, key=lambda k: (size_order(k[0]), _step_order(k[1]), k[2])):
        group = groups[key]
        kept, repeats = independent({pair: [o for p in matched for o in (p.treatment,
                                                                          p.control)]
                                     for pair, matched in group.items()})
        per_pair = _per_pair({pair: [p.ratio for p in group[pair]] for pair in kept})
        interval = bootstrap_interval([r for _, r in per_pair], confidence=confidence,
                                      resamples=resamples, seed=seed)
        out.append(PairedRatio(*key, per_pair, sum(len(group[pair]) for pair in kept),
                               interval, repeats))
    return out


@dataclass(frozen=True)
class SessionCell:
    arm: str
    placement: str
    sessions: tuple[SessionObservation, ...]

    @property
    def n(self) -> int:
        return len(self.sessions)

    @property
    def block_pairs(self) -> int:
        """The independent block pairs behind the cell (a repeat counts once)."""
        return len(self.per_pair_wall_s)

    @property
    def median_wall_s(self) -> float:
        return statistics.median(s.wall_s for s in self.sessions)

    @cached_property
    def per_pair_wall_s(self) -> tuple[float, ...]:
        """The median session wall time in each independent block pair, in pair order."""
        kept, _ = independent(_by_pair(self.sessions))
        return tuple(m for p, m in pair_medians((s.pair, s.wall_s) for s in self.sessions)
                     if p in kept)


def session_cells(sessions: Iterable[SessionObservation]) -> list[SessionCell]:
    groups: dict[tuple[str, str], list[SessionObservation]] = defaultdict(list)
    for s in sessions:
        groups[(s.arm, s.placement)].append(s)
    order = sorted(groups, key=lambda k: (arm_order(k[0]), PLACEMENTS.index(k[1])
                                          if k[1] in PLACEMENTS else len(PLACEMENTS)))
    return [SessionCell(*key, tuple(groups[key])) for key in order]


@dataclass(frozen=True)
class SessionRatio:
    """Session wall time NUMERATOR/DENOMINATOR within SUBJECT, paired per block pair (the
    ratio of the two medians in each pair): "alternating/fixed" within an arm, or
    "ON/OFF" within a placement."""

    subject: str
    ratio: str
    per_pair: tuple[tuple[int, float], ...]  # the independent pairs only
    interval: Interval | None
    repeats: Repeats = ()  # pairs left out: their sessions repeat an earlier pair's

    @property
    def block_pairs(self) -> int:
        return len(self.per_pair)

    @property
    def median(self) -> float:
        return statistics.median(r for _, r in self.per_pair)

    @property
    def spread(self) -> str:
        return (str(self.interval) if self.interval else no_interval(self.block_pairs)) + \
            repeats_text(self.repeats)


def _of(sessions: Iterable[SessionObservation], arm: str, placement: str
        ) -> list[SessionObservation]:
    return [s for s in sessions if s.arm == arm and s.placement == placement]


def _ratio(subject: str, ratio: str, top: Sequence[SessionObservation],
           bottom: Sequence[SessionObservation], confidence: float, resamples: int,
           seed: int) -> SessionRatio | None:
    """TOP's median wall time over BOTTOM's in each block pair that holds both, over the
    pairs whose sessions repeat no earlier pair's."""
    highs = dict(pair_medians((s.pair, s.wall_s) for s in top))
    lows = dict(pair_medians((s.pair, s.wall_s) for s in bottom))
    both = set(highs) & set(lows)
    if not both:
        return None
    kept, repeats = independent({p: [s for s in (*top, *bottom) if s.pair == p] for p in both})
    per_pair = tuple((p, highs[p] / lows[p]) for p in kept)
    interval = bootstrap_interval([r for _, r in per_pair], confidence=confidence,
                                  resamples=resamples, seed=seed)
    return SessionRatio(subject, ratio, per_pair, interval, repeats)


def session_ratios(sessions: Sequence[SessionObservation], *, confidence: float = CONFIDENCE,
                   resamples: int = RESAMPLES, seed: int = SEED) -> list[SessionRatio]:
    """Per arm: alternating/fixed; per placement: each other arm / OFF."""
    arms = sorted({s.arm for s in sessions}, key=arm_order)
    found = [_ratio(arm, "alternating/fixed", _of(sessions, arm, "alternating"),
                    _of(sessions, arm, "fixed"), confidence, resamples, seed)
             for arm in arms]
    found += [_ratio(placement, f"{arm}/{CONTROL}", _of(sessions, arm, placement),
                     _of(sessions, CONTROL, placement), confidence, resamples, seed)
              for placement in PLACEMENTS for arm in arms if arm != CONTROL]
    return [r for r in found if r is not None]


@dataclass
class Analysis:
    """Everything the tables, the plots and ``compare`` read from one screening."""

    run: PerfRun
    cells: list[Cell] = field(default_factory=list)
    pairing: Pairing = field(default_factory=Pairing)
    ratios: list[PairedRatio] = field(default_factory=list)
    session_cells: list[SessionCell] = field(default_factory=list)
    session_ratios: list[SessionRatio] = field(default_factory=list)

    @property
    def arm_pairs(self) -> dict[str, int]:
        """How many block pairs hold each arm the run's blocks ran (pairs of a merge may
        hold different treatments): a treatment's ratios use only its own pairs."""
        return arm_pairs(self.run.blocks, self.run.block_pairs)

    @property
    def treatment_pairs(self) -> dict[str, int]:
        """``arm_pairs`` of the treatments (every arm but OFF), in arm order."""
        pairs = self.arm_pairs
        return {arm: pairs[arm] for arm in sorted(pairs, key=arm_order) if arm != CONTROL}

    def cell(self, size: str, arm: str, step: str) -> Cell | None:
        return next((c for c in self.cells
                     if (c.size, c.arm, c.step) == (size, arm, step)), None)


def analyse(run: PerfRun, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
            seed: int = SEED) -> Analysis:
    """Cells, pairing (refusals kept, not raised: the caller decides) and paired ratios
    over the pairs that matched."""
    pairing = pair_run(run)
    return Analysis(
        run=run, cells=cells(run.observations), pairing=pairing,
        ratios=paired_ratios(pairing.pairs, confidence=confidence, resamples=resamples,
                             seed=seed),
        session_cells=session_cells(run.sessions),
        session_ratios=session_ratios(run.sessions, confidence=confidence,
                                      resamples=resamples, seed=seed))
