"""The verdict of one pair of identity cells, from data (no launch, no torch).

The ``same`` side is the positive control: the same identity must hit, with answers (or
bytes) exact; a miss there means caching was off or the pool lost the KV, so the ``other``
side's "no hit" proves nothing (a paired assertion: PR #53347) and the pair is VOID. The
``other`` side must not hit; a hit that answered exactly is a legitimate share; a hit that
answered wrong is an ``identity`` failure naming the dimension; for the salt any hit is an
``isolation`` failure, whatever the answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_sharedkv.identity.table import Dimension, Side
from pytest_sharedkv.report.records import Kind, Status


@dataclass(frozen=True)
class SideResult:
    """What one side observed: hit tokens (None: no counter read), whether what it got
    was exact (None: nothing to judge), a problem that kept it from running."""

    side: Side
    hit: int | None
    exact: bool | None
    detail: str = ""
    error: str = ""
    cold_hit: int = 0  # the reference (a fresh salt) hit: a leak of its own


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    status: Status
    message: str

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL


def _same(result: SideResult) -> Verdict:
    if result.error:
        return Verdict(Kind.ERROR, Status.FAIL, f"same identity: {result.error}")
    if result.hit is None:
        return Verdict(Kind.HITS_UNKNOWN, Status.UNKNOWN,
                       "same identity: the hit counter could not be read")
    if result.hit == 0:
        return Verdict(Kind.HITS, Status.VOID,
                       "VOID: the same identity did not hit (caching off, or the pool lost "
                       "the KV), so a miss under another identity proves nothing")
    if result.exact is False:
        return Verdict(Kind.DIVERGENCE, Status.FAIL,
                       f"the same identity hit {result.hit} tokens and got wrong KV: "
                       f"{result.detail}")
    return Verdict(Kind.CHECK, Status.PASS, f"the same identity hit {result.hit} tokens, exact")


def _other(dimension: Dimension, result: SideResult) -> Verdict:
    if result.error:
        return Verdict(Kind.ERROR, Status.FAIL, f"other {dimension}: {result.error}")
    if result.cold_hit:  # any dimension: its reference's fresh salt hit KV it never stored
        return Verdict(Kind.ISOLATION, Status.FAIL,
                       f"ISOLATION: a fresh cache_salt hit {result.cold_hit} tokens")
    if result.hit is None:
        return Verdict(Kind.HITS_UNKNOWN, Status.UNKNOWN,
                       f"other {dimension}: the hit counter could not be read")
    if result.hit and dimension is Dimension.SALT:
        return Verdict(Kind.ISOLATION, Status.FAIL,
                       f"ISOLATION: another tenant's cache_salt hit {result.hit} tokens of "
                       f"KV it never stored ({'exact' if result.exact else 'wrong'} "
                       "answers: a breach whatever the answers)")
    if result.hit and result.exact is False:
        return Verdict(Kind.IDENTITY, Status.FAIL,
                       f"IDENTITY {dimension}: another {dimension} hit {result.hit} tokens "
                       f"and got wrong KV: {result.detail}")
    if result.hit:
        return Verdict(Kind.CHECK, Status.PASS,
                       f"another {dimension} hit {result.hit} tokens and got exact KV "
                       "(shared legitimately)")
    return Verdict(Kind.CHECK, Status.PASS, f"another {dimension} did not hit")


def judge(dimension: Dimension, same: SideResult, other: SideResult
          ) -> tuple[Verdict, Verdict]:
    """(the same side's verdict, the other side's): the other side's pass is VOID where
    the positive control did not hold; its failures stand whatever the control did."""
    first, second = _same(same), _other(dimension, other)
    if second.status is Status.PASS and first.status is not Status.PASS:
        second = Verdict(second.kind, Status.VOID,
                         f"VOID ({first.message.removeprefix('VOID: ')}): {second.message}")
    return first, second


def pair_status(verdicts: tuple[Verdict, Verdict]) -> Status:
    """One status for the pair: a failure of either side, else VOID/UNKNOWN, else pass."""
    statuses = [v.status for v in verdicts]
    for status in (Status.FAIL, Status.UNKNOWN, Status.VOID):
        if status in statuses:
            return status
    return Status.PASS
