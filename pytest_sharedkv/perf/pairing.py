"""Matching each measured request of one arm with the same request of the control arm (OFF)
in the same block pair: the pair is the independent unit of every comparison.

Two observations are partners when they share (payload sha256, replica, step, size,
request) in two arms of one block pair. A block pair is OFF and one block of each
treatment arm the run screened: OFF-ON, OFF-NATIVE, or OFF-ON-NATIVE; each treatment
pairs with OFF of its own pair. Which blocks form a pair is the run's ``block_pairs``
(a merge may hold pairs of different arms and sizes); reports written before it are
consecutive pairs of one size each. An observation without exactly one partner is
refused, and so is a partner whose prompt or output token count differs (the two arms did
not answer the same thing, so their times do not compare); so is every observation of a
pair without OFF. Warm-ups are left out here and in every statistic, but stay in the data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pytest_sharedkv.config.options import CONTROL_ARM
from pytest_sharedkv.perf.observations import Observation, PerfReportError, PerfRun

CONTROL = CONTROL_ARM  # the denominator of every paired ratio, where a pair holds it

Key = tuple[str, str, str, str, str]


def pair_key(o: Observation) -> Key:
    return (o.payload_sha256, o.replica, o.step, o.size, o.request)


@dataclass(frozen=True)
class Refusal:
    """Why one observation takes no part in a paired comparison."""

    request: str
    block: int
    arm: str
    pair: int
    reason: str

    def __str__(self) -> str:
        return (f"request {self.request} (block {self.block}, arm {self.arm}, pair "
                f"{self.pair}): {self.reason}")


@dataclass(frozen=True)
class PairedRequest:
    """One request measured in both arms of one block pair."""

    pair: int
    size: str
    step: str
    request: str
    treatment: Observation
    control: Observation

    @property
    def arms(self) -> str:
        return f"{self.treatment.arm}/{self.control.arm}"

    @property
    def ratio(self) -> float:
        """treatment TTFT / control TTFT."""
        return self.treatment.ttft_s / self.control.ttft_s


@dataclass
class Pairing:
    pairs: list[PairedRequest] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals

    def check(self) -> list[PairedRequest]:
        """The pairs, or ``PairingError`` naming every refused observation."""
        if self.refusals:
            raise PairingError(self.refusals)
        return self.pairs


class PairingError(PerfReportError):
    def __init__(self, refusals: Sequence[Refusal]) -> None:
        self.refusals = list(refusals)
        shown = "; ".join(str(r) for r in self.refusals[:5])
        more = f"; and {len(self.refusals) - 5} more" if len(self.refusals) > 5 else ""
        super().__init__(f"{len(self.refusals)} observation(s) refused pairing: {shown}{more}")


def _refuse(o: Observation, reason: str) -> Refusal:
    return Refusal(o.request, o.block, o.arm, o.pair, reason)


def _where(o: Observation) -> str:
    return f"{o.size} {o.step} on replica {o.replica}"


def blocks_per_pair(blocks: Sequence[str] | None) -> int:
    """Blocks in each block pair of a run that did not record its pairs (every pair then
    had the same arms): one per distinct arm (2, or 3 with ON and NATIVE)."""
    return max(2, len(set(blocks))) if blocks else 2


def pair_layout(blocks: Sequence[str], block_pairs: Sequence[int] | None = None) -> list[int]:
    """The block pair of each block: BLOCK_PAIRS where recorded, else (a report written
    before pairs could differ) consecutive pairs of ``blocks_per_pair(blocks)`` blocks."""
    if block_pairs:
        return list(block_pairs)
    size = blocks_per_pair(blocks)
    return [i // size for i in range(len(blocks))]


def pair_arms(blocks: Sequence[str], block_pairs: Sequence[int] | None = None
              ) -> dict[int, list[str]]:
    """Each block pair's arms, in the order its blocks ran."""
    arms: dict[int, list[str]] = defaultdict(list)
    for arm, pair in zip(blocks, pair_layout(blocks, block_pairs), strict=True):
        arms[pair].append(arm)
    return dict(arms)


def arm_pairs(blocks: Sequence[str], block_pairs: Sequence[int] | None = None
              ) -> dict[str, int]:
    """How many block pairs hold each arm (OFF: every pair; a treatment: the pairs its
    ratios and their interval can use), in order of first appearance."""
    counts: dict[str, int] = {}
    for arms in pair_arms(blocks, block_pairs).values():
        for arm in dict.fromkeys(arms):
            counts[arm] = counts.get(arm, 0) + 1
    return counts


def _arms(observations: Sequence[Observation], planned: Sequence[str] | None) -> list[str]:
    """The arms of one block pair: its blocks' (PLANNED, where the run's blocks are known,
    so a block that recorded nothing still counts) and what was recorded; OFF first."""
    arms = [*(planned or ()), *(o.arm for o in observations)]
    unique = list(dict.fromkeys(arms))
    return sorted(unique, key=lambda a: a != CONTROL)


def _problem(arms: Sequence[str], planned: Sequence[str] | None, pair: int) -> str | None:
    """Why no observation of block pair PAIR can be paired, or None."""
    if planned is None and len(arms) > 2:
        return f"block pair {pair} holds the arms {', '.join(arms)}; a pair is 2 blocks of 2 arms"
    stray = [a for a in arms if planned is not None and a not in planned]
    if stray:
        return (f"block pair {pair} holds the arms {', '.join(arms)}, but its blocks ran "
                f"{'-'.join(planned or ())}")
    if len(arms) < 2:
        return f"no partner: block pair {pair} ran only arm {arms[0]}"
    if CONTROL not in arms:
        return (f"no control: block pair {pair} holds no {CONTROL} block ({'-'.join(arms)}); "
                f"every treatment pairs with {CONTROL} of its own pair")
    return None


def pair_observations(observations: Iterable[Observation],
                      blocks: Sequence[str] | None = None,
                      block_pairs: Sequence[int] | None = None) -> Pairing:
    """Match every measured observation with its partner in the other arm of its block
    pair. ``blocks`` (the run's arm per block) lets a block that recorded nothing refuse
    the requests of its partner block; ``block_pairs`` says which blocks form each pair
    (unrecorded: consecutive pairs of one size)."""
    result = Pairing()
    by_pair: dict[int, list[Observation]] = defaultdict(list)
    for o in observations:
        if not o.warmup:
            by_pair[o.pair].append(o)
    planned = pair_arms(blocks, block_pairs) if blocks is not None else {}
    for pair in sorted(by_pair):
        group = by_pair[pair]
        arms = _arms(group, planned.get(pair))
        problem = _problem(arms, planned.get(pair), pair)
        if problem is not None:
            result.refusals += [_refuse(o, problem) for o in group]
            continue
        keyed: dict[str, dict[Key, list[Observation]]] = {arm: {} for arm in arms}
        for o in group:
            keyed[o.arm].setdefault(pair_key(o), []).append(o)
        for arm, mine_by_key in keyed.items():
            for key, mine in mine_by_key.items():
                if len(mine) > 1:
                    result.refusals += [_refuse(o, f"measured {len(mine)} times in arm {arm}"
                                                   f" of block pair {pair} ({_where(o)})")
                                        for o in mine]
                    continue
                for other in arms:
                    if other != arm and key not in keyed[other]:
                        o = mine[0]
                        result.refusals.append(_refuse(
                            o, f"no partner in arm {other} of block pair {pair} "
                               f"({_where(o)}, payload sha256 {o.payload_sha256[:16]})"))
        for treatment in arms[1:]:
            result.pairs += _matched(keyed, CONTROL, treatment, pair, result)
    return result


def pair_run(run: PerfRun) -> Pairing:
    """``pair_observations`` of a whole screening, with its blocks and recorded pairs."""
    return pair_observations(run.observations, run.blocks or None, run.block_pairs or None)


def _matched(keyed: dict[str, dict[Key, list[Observation]]], control: str, treatment: str,
             pair: int, result: Pairing) -> list[PairedRequest]:
    """TREATMENT's requests matched with CONTROL's in one block pair; a partner with other
    token counts is refused (into RESULT) instead."""
    matched = []
    for key, treated in keyed[treatment].items():
        controls = keyed[control].get(key, [])
        if len(treated) != 1 or len(controls) != 1:
            continue
        t, c = treated[0], controls[0]
        mismatch = [f"{name} {getattr(t, name)} in block {t.block} ({t.arm}) but "
                    f"{getattr(c, name)} in block {c.block} ({c.arm})"
                    for name in ("prompt_tokens", "output_tokens")
                    if getattr(t, name) != getattr(c, name)]
        if mismatch:
            why = f"token counts differ across arms ({_where(t)}): " + "; ".join(mismatch)
            result.refusals += [_refuse(t, why), _refuse(c, why)]
            continue
        matched.append(PairedRequest(pair, t.size, t.step, t.request, t, c))
    return matched
