"""The steps a prompt goes through on a replica pair, and the replica each runs on.

A cold on A (nothing cached), A again (the engine's own prefix cache), B (the shared
pool: the cross-replica step the stack exists for), B again (B's own cache, now filled
from the pool). The service, replica_pair and perf tiers all order requests this way, so
the map is written once: a tier that sent "cross" to A would prove nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    name: str
    replica: str
    hits: str  # the only kind of hit this step may have: none | local | external


STEPS = (Step("cold", "A", "none"), Step("local", "A", "local"),
         Step("cross", "B", "external"), Step("receiver-local", "B", "local"))
STEP_NAMES = tuple(s.name for s in STEPS)
STEP_REPLICA = {s.name: s.replica for s in STEPS}
OTHER = {"A": "B", "B": "A"}  # each replica's peer


def step(name: str) -> Step:
    """The step called NAME (a KeyError names an unknown one)."""
    for candidate in STEPS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no step {name!r}; the steps are {', '.join(STEP_NAMES)}")
