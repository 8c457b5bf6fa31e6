"""Triage of the recurrent-state class (issue 48 item 4), as data: the controls that
separate its causes, each a cell, and the verdict that names which one removed it.

The class: replica B resumes its Gated DeltaNet layers from a state no engine kept (vLLM's
``align`` mode keeps a state only where a scheduler step ends; LMCache stores chunks whose
state region is the null block), and answers or the state oracle show it. A cell
*removes* it when every cross-replica answer is exact, the state oracle judged every
state load exact, and no load resumed from a state A never kept; it *leaves* it when any
of them shows again. A cell that could not run is unknown; one the release offers nothing
for is n/a with the reason. Where the fix belongs is said only from a cell that removed
it: the verdict names those cells and nothing else.

The cells are definitions here (their flags, the corpus they need): the service tier's
runner has not yet been taught to launch them (``contrib/gpu-host/plans/
hybrid-state.sh`` runs the same controls as lanes of their own on a GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Outcome(str, Enum):
    REMOVED = "removed"
    LEFT = "left"
    UNKNOWN = "unknown"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class StateControl:
    """One control: what it changes, the cause it rules in when it removes the class."""

    name: str
    what: str
    cause: str
    vllm_args: tuple[str, ...] = ()  # "{chunk}": LMCache's chunk in tokens
    concurrency: int | None = None
    model_kind: str | None = None  # another model kind (make-model --kind)
    requires: str = ""  # what the release must offer; "" none

    def args(self, chunk: int) -> tuple[str, ...]:
        return tuple(a.replace("{chunk}", str(chunk)) for a in self.vllm_args)


CONTROLS: tuple[StateControl, ...] = (
    StateControl("steps-every-chunk",
                 "A's prefill ends a scheduler step at every chunk, one request a step",
                 "states kept only where a scheduler step ends (vLLM align mode) and "
                 "loaded at chunks where none was kept",
                 ("--max-num-batched-tokens", "{chunk}", "--max-num-seqs", "1")),
    StateControl("one-sequence", "--max-num-seqs 1 alone (steps as large as the default)",
                 "requests sharing a scheduler step", ("--max-num-seqs", "1")),
    StateControl("concurrency-1", "the runner sends one request at a time",
                 "requests in flight together", concurrency=1),
    StateControl("attention-only", "the attention-only copy model: no recurrent state",
                 "the recurrent state itself (attention KV moves right)",
                 model_kind="copy-attention"),
    StateControl("group-per-layer-kind",
                 "LMCache stores one object group per layer kind (attention, state)",
                 "LMCache's one object holding both kinds with a null state region",
                 requires="an LMCache 0.5.6 setting that splits object groups by layer "
                          "kind: none named yet"),
)


def outcome_of(exact_answers: bool | None, oracle_exact: bool | None,
               unkept_loads: int | None) -> Outcome:
    """A cell's outcome from its data (None: not read). What was read and shows the class
    leaves it, whatever was not read; removing it takes all three read and clean."""
    if exact_answers is False or oracle_exact is False or (unkept_loads or 0) > 0:
        return Outcome.LEFT
    if exact_answers is None or oracle_exact is None or unkept_loads is None:
        return Outcome.UNKNOWN
    return Outcome.REMOVED


def verdict(outcomes: Mapping[str, Outcome]) -> str:
    """One line: the cells that removed the class (and the causes they name), the others
    by outcome; no cause is named where no cell removed it."""
    by_name = {c.name: c for c in CONTROLS}
    removed = [n for n in by_name if outcomes.get(n) is Outcome.REMOVED]
    rest = ", ".join(f"{n} {outcomes.get(n, Outcome.UNKNOWN).value}" for n in by_name
                     if n not in removed)
    if not removed:
        return (f"RECURRENT STATE TRIAGE: no control removed it ({rest}): no cause is "
                "named")
    named = "; ".join(f"{n}: {by_name[n].cause}" for n in removed)
    return f"RECURRENT STATE TRIAGE: removed by {named}" + (f" (others: {rest})" if rest else "")
