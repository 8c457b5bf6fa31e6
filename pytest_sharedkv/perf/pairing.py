"""Matching each measured request of one arm with the same request of the control arm (OFF)
in the same block pair: the pair is the independent unit of every comparison.

Two observations are partners when they share (payload sha256, replica, step, size,
request) in two arms of one block pair. A block pair is two blocks (OFF, ON), or three
where the run adds vLLM's native offloading (OFF, ON, NATIVE): each treatment arm pairs
with OFF. An observation without exactly one partner is
refused, and so is a partner whose prompt or output token count differs (the two arms did
not answer the same thing, so their times do not compare). Warm-ups are left out here and
in every statistic, but stay in the data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pytest_sharedkv.perf.observations import Observation, PerfReportError

CONTROL = "OFF"  # the denominator of every paired ratio, where a pair holds it

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
    """Blocks in one block pair: one per distinct arm of the run (2, or 3 with NATIVE)."""
    return max(2, len(set(blocks))) if blocks else 2


def _arms(observations: Sequence[Observation], blocks: Sequence[str] | None,
          pair: int) -> list[str]:
    """The arms of one block pair: from the run's block list where given (so a block that
    recorded nothing still counts), else from what was recorded; OFF first."""
    arms = [o.arm for o in observations]
    if blocks is not None:
        size = blocks_per_pair(blocks)
        arms = [*blocks[size * pair:size * pair + size], *arms]
    unique = list(dict.fromkeys(arms))
    return sorted(unique, key=lambda a: a != CONTROL)


def pair_observations(observations: Iterable[Observation],
                      blocks: Sequence[str] | None = None) -> Pairing:
    """Match every measured observation with its partner in the other arm of its block
    pair. ``blocks`` (the run's arm per block) lets a block that recorded nothing refuse
    the requests of its partner block."""
    result = Pairing()
    by_pair: dict[int, list[Observation]] = defaultdict(list)
    for o in observations:
        if not o.warmup:
            by_pair[o.pair].append(o)
    for pair in sorted(by_pair):
        group = by_pair[pair]
        arms = _arms(group, blocks, pair)
        size = blocks_per_pair(blocks)
        if len(arms) < 2 or len(arms) > size:
            reason = (f"block pair {pair} holds the arms {', '.join(arms)}; a pair is {size} "
                      f"blocks of {size} arms" if len(arms) > size else
                      f"no partner: block pair {pair} ran only arm {arms[0]}")
            result.refusals += [_refuse(o, reason) for o in group]
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
        control = arms[0]
        for treatment in arms[1:]:
            result.pairs += _matched(keyed, control, treatment, pair, result)
    return result


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
