"""The fault catalogue's classes: what each does to a real run, where it is injected, what
should catch it, and what counts as applied. The catalogue runner and the stub double read
this table; the hook (``fault_hook.py``) applies the classes it owns by name.

A fault that was never applied proves nothing (VOID, as an unfired gate is), and a fault
placed in bytes no engine reads is a control that nothing should catch, so "applied"
is stated per class. Standard library only: the launching side imports it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Detector(str, enum.Enum):
    """What shows a fault: wrong answers, the in-engine KV audit, the engines' hit counts."""

    ANSWERS = "answers"
    AUDIT = "audit"
    HITS = "hits"


class Injector(str, enum.Enum):
    """Where a class is injected."""

    FAULT_HOOK = "engine_hooks.fault_hook"  # SHAREDKV_FAULT_CONTROL, in the LMCache server
    DELAY_HOOK = "engine_hooks.delay_hook"  # SHAREDKV_INJECT_DELAY_CYCLES, every process
    L2_FAULT_INJECT = "stack.l2 fault_inject"  # LMCache's fault_inject L2 adapter


@dataclass(frozen=True)
class FaultClass:
    name: str
    does: str
    injector: Injector
    direction: str  # the transfer it acts on: "retrieve", "store" or "" (not a transfer)
    caught_by: frozenset[Detector]  # empty: nothing should catch it (a recovery, a control)
    # the copy model's answers stay exact (True), change (False), or may do either (None)
    answers_exact: bool | None
    applied: str  # what the run's logs must show, else the cell is VOID
    engine_reads: bool = True  # placed in bytes an engine reads (False: the control)


CLASSES: tuple[FaultClass, ...] = (
    FaultClass(
        "misrouted", "two adjacent chunks' memory objects of one retrieve exchanged, both "
        "before its last chunk (so only attention KV moves, at the wrong positions)",
        Injector.FAULT_HOOK, "retrieve", frozenset({Detector.AUDIT}), True,
        "an 'applied' fault-log line from the server naming both chunks, every attention "
        "span read by an engine"),
    FaultClass(
        "key-collision", "another request's bytes under a key: a mid-prompt chunk's object "
        "holds, for this retrieve, the bytes of another request's chunk",
        Injector.FAULT_HOOK, "retrieve", frozenset({Detector.ANSWERS, Detector.AUDIT}), False,
        "an 'applied' line naming the donor request and the chunk, attention spans read"),
    FaultClass(
        "lost-write", "a store whose copy of one chunk is skipped while its key is committed:"
        " the pool serves that object's previous bytes",
        Injector.FAULT_HOOK, "store", frozenset({Detector.ANSWERS, Detector.AUDIT}), False,
        "an 'applied' line for the store, then a retrieve of that key (hits count it: the "
        "key was committed)"),
    FaultClass(
        "bit-flip", "one bit flipped, for one retrieve, in attention KV an engine reads "
        "(silent pool corruption)", Injector.FAULT_HOOK, "retrieve",
        frozenset({Detector.AUDIT}), None,
        "an 'applied' line whose one span is attention KV read by an engine"),
    FaultClass(
        "bit-flip-unread", "the control: one bit flipped in recurrent state of a mid-prompt "
        "chunk, which goes to the null block no engine reads", Injector.FAULT_HOOK,
        "retrieve", frozenset(), True,
        "an 'applied' line whose one span is read by no engine", engine_reads=False),
    FaultClass(
        "state-unrestored", "the last chunk's recurrent state not restored: its blocks go to "
        "the null block, the engine keeps its block's old state",
        Injector.FAULT_HOOK, "retrieve", frozenset({Detector.ANSWERS, Detector.AUDIT}), False,
        "an 'applied' line naming every recurrent span of the last chunk, each read"),
    FaultClass(
        "state-foreign", "the last chunk's recurrent state replaced by another request's",
        Injector.FAULT_HOOK, "retrieve", frozenset({Detector.ANSWERS, Detector.AUDIT}), False,
        "an 'applied' line naming the donor request and the recurrent spans, each read"),
    FaultClass(
        "delayed-producer", "a delay kernel before every KV transfer: a stream-ordering race "
        "becomes a deterministic wrong answer", Injector.DELAY_HOOK, "",
        frozenset({Detector.ANSWERS, Detector.AUDIT}), None,
        "the delay hook's log shows calls in the server (delay_hook.void_problem is None); "
        "caught only where the stack races"),
    FaultClass(
        "l2-load-failure", "with the two-host topology, an L2 load that fails (LMCache's "
        "fault_inject adapter): the stack must recompute", Injector.L2_FAULT_INJECT, "",
        frozenset(), True,
        "the reader's lookup trimmed at the gap (fewer hit tokens than stored); the answers "
        "exact, fewer hits than the clean run", engine_reads=False),
)

BY_NAME: dict[str, FaultClass] = {c.name: c for c in CLASSES}
HOOK_CLASSES = tuple(c.name for c in CLASSES if c.injector is Injector.FAULT_HOOK)


def fault_class(name: str) -> FaultClass:
    """The class NAME (KeyError naming the known ones)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no fault class {name!r} (known: {', '.join(BY_NAME)})") from None
