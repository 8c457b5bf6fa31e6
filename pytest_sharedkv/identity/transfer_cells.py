"""The identity table on the real LMCache server (``stack.checks.identity_transfer``): which of
the drivers' observations is each dimension's ``same`` side and ``other`` side.

- salt: W fetches back what it stored under the tenant's salt / W looks it up under
  another salt (must miss: any hit is an isolation failure).
- chunk-size: W (chunk 256) fetched it / R2 (chunk 512, the same L2) fetches it.
- restart-server: R (restarted, chunk 256, the same L2) fetches it / R2 (restarted with a
  changed configuration under the same name) fetches it.
- lmcache-release, per direction: a restarted server of the reading release fetches its
  own release's salt (the control) / the writing release's salt (keys found and bytes
  exact, keys refused, or wrong bytes served).
"""

from __future__ import annotations

from typing import Any

from pytest_sharedkv.identity.judge import SideResult
from pytest_sharedkv.identity.table import Dimension, Side
from pytest_sharedkv.stack.checks.identity_transfer import Observed

SIDES: dict[Dimension, tuple[tuple[str, str], tuple[str, str]]] = {
    # (op, part that ran it) of the same side, of the other side
    Dimension.SALT: (("w-fetch", "W"), ("w-other-salt", "W")),
    Dimension.CHUNK: (("w-fetch", "W"), ("r2-fetch", "R2")),
    Dimension.RESTART_SERVER: (("r-fetch", "R"), ("r2-fetch", "R2")),
}
# direction -> (the reader's control, the reading across releases)
DIRECTIONS: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "old writes, new reads": (("new-reads-new", "NEW-R"), ("new-reads-old", "NEW-R")),
    "new writes, old reads": (("old-reads-old", "OLD-R"), ("old-reads-new", "OLD-R")),
}


def side(observed: Observed, which: Side, op: str, part: str) -> SideResult:
    """One side from the op's result (a part that failed: its problem)."""
    problem = observed.problems.get(part, "")
    found: dict[str, Any] = observed.op(op)
    if problem or not found:
        return SideResult(which, None, None, error=problem or f"no result for {op}")
    hit = int(found.get("hit", 0))
    if "pages_compared" not in found:  # a lookup: nothing to judge but the hit
        return SideResult(which, hit, None)
    if hit and not found.get("retrieved"):
        return SideResult(which, hit, None,
                          error=f"the retrieve failed after a hit of {hit} tokens")
    wrong = int(found.get("mismatched_pages", 0))
    return SideResult(which, hit, bool(hit) and not wrong,
                      f"{wrong} of {found.get('pages_compared')} pages hold wrong bytes"
                      if wrong else "")


def sides(observed: Observed, dimension: Dimension) -> tuple[SideResult, SideResult]:
    (same_op, same_part), (other_op, other_part) = SIDES[dimension]
    return (side(observed, Side.SAME, same_op, same_part),
            side(observed, Side.OTHER, other_op, other_part))


def direction_sides(observed: Observed, direction: str) -> tuple[SideResult, SideResult]:
    (same_op, same_part), (other_op, other_part) = DIRECTIONS[direction]
    return (side(observed, Side.SAME, same_op, same_part),
            side(observed, Side.OTHER, other_op, other_part))


def direction_word(other: SideResult) -> str:
    """The direction's verdict in the issue's words, from the other side's data."""
    if other.error or other.hit is None:
        return "not judged"
    if not other.hit:
        return "keys refused"
    return "keys found, bytes exact" if other.exact else "wrong bytes served"
