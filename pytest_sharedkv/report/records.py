"""Result records: what every tier reports, in a form that crosses xdist as plain data.

A test appends ``Check`` records through the ``sharedkv_results`` fixture; the plugin
moves them onto the test report's ``user_properties`` (which xdist already serialises),
and the controller gathers them for the terminal tables and the JSON report.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

ROLES = ("control", "negative-control", "under-test", "check")
# A record's kind: what it found wrong or, when it found nothing wrong, what it checks.
# ``compare`` reads kind and status, never the message, so rewording a message cannot
# change a verdict.
KINDS = (
    "check",  # a cell whose passed/trials is the whole verdict (the default)
    "gate",  # the service tier's sensitivity gate (the negative control of a launched run)
    "divergence",  # an answer that is not the right one
    "leak",  # a cold request that hit a cache: namespaces are not separate
    "hits",  # hits that are not the kind or number a step may have
    "hits-unknown",  # the engine reports no hit counter, so hits cannot be accounted
    "audit-mismatch",  # KV bytes B loaded differ from what A stored (the in-engine audit)
    "protocol",  # an OpenAI-protocol property clients depend on
    "session",  # a multi-turn session (exact answers, hits)
    "error",  # a request or process failed, so nothing was judged
    "model-sensitivity",  # the copy model's corruption matrix
    "ordering",  # a stream-ordering probe cell
    "bytes",  # a byte-exact KV round trip (packed_page, the transfer pair)
    "pinned",  # a pinned-pool allocation route
    "triage",  # a triage cell (pass: its control removed the fault; fail: it showed again)
    "triage-verdict",  # the class of fault the triage's cells name
    "note",  # a note's default: it judges nothing
)
# pass/fail: whether the record's checks held (for an ordering negative control under
# delay a fail is what shows the probe is sensitive: read ``role``); void: the record
# proves nothing (the gate or delay never acted); confounded: the gate's corruption may
# have been undone by the fault under test; unproven: nothing could be injected; xfail: a
# combination refused by design; unknown: a counter the verdict needs could not be read;
# info: recorded, judges nothing (warm-ups, notes). A record's ``status`` is the one place
# a reader learns this: ``detail`` may carry a tier's own finer word (the gate's
# "proven"/"VOID"/"CONFOUNDED"), but no verdict is read from it.
STATUSES = ("pass", "fail", "void", "confounded", "unproven", "unknown", "xfail", "info")
# When one record found several things, the kind it carries (the first here wins).
PRECEDENCE = ("leak", "divergence", "audit-mismatch", "hits-unknown", "hits", "error")


def worst_kind(kinds: Iterable[str], default: str) -> str:
    """The kind a record that found KINDS carries (see PRECEDENCE); DEFAULT if none."""
    found = set(kinds)
    return next((k for k in PRECEDENCE if k in found), default)


def _valid(kind: str, status: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")


class Problem(str):
    """A problem's text (what a test shows and joins) that knows its kind."""

    kind: str

    def __new__(cls, text: str, kind: str) -> Problem:
        self = super().__new__(cls, text)
        self.kind = kind
        return self


def kinds_of(problems: Iterable[str]) -> list[str]:
    """The kinds of PROBLEMS (a plain string has none)."""
    return [p.kind for p in problems if isinstance(p, Problem)]


@dataclass
class Check:
    """One cell of a tier's matrix: ``passed`` of ``trials`` checks held.

    ``key`` names the cell (e.g. target, direction, size, delay); ``role`` says whether
    the thing checked is a control, the negative control or the thing under test;
    ``detail`` carries the evidence (first mismatching offset, bytes, timings); ``kind``
    and ``status`` (see KINDS, STATUSES) are what a reader judges by. An empty status is
    pass when every trial held, else fail.
    """

    tier: str
    key: dict[str, str]
    passed: int
    trials: int
    role: str = "check"
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    nodeid: str = ""
    kind: str = "check"
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "pass" if self.ok else "fail"
        _valid(self.kind, self.status)
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {self.role!r}")
        if not 0 <= self.passed <= self.trials:
            raise ValueError(f"passed={self.passed} must lie in 0..trials={self.trials}")

    @property
    def ok(self) -> bool:
        return self.passed == self.trials

    @property
    def void(self) -> bool:
        """The record proves nothing (its probe, gate or audit could not have seen a fault)."""
        return self.status == "void"


@dataclass
class Note:
    """A line a tier wants under its table (a verdict, a sensitivity warning, a rate)."""

    tier: str
    text: str
    level: str = "info"  # info | warning | verdict
    nodeid: str = ""
    kind: str = "note"
    status: str = "info"  # void: the note says a result proves nothing

    def __post_init__(self) -> None:
        _valid(self.kind, self.status)


@dataclass
class Fact:
    """Something about the environment a test learned in-process (e.g. cuda_ops bound)."""

    name: str
    value: str
    nodeid: str = ""


@dataclass
class Bundle:
    checks: list[Check] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.checks or self.notes or self.facts)

    def to_data(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "checks": [asdict(c) for c in self.checks],
            "notes": [asdict(n) for n in self.notes],
            "facts": [asdict(f) for f in self.facts],
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Bundle:
        return cls(
            checks=[Check(**c) for c in data.get("checks", [])],
            notes=[Note(**n) for n in data.get("notes", [])],
            facts=[Fact(**f) for f in data.get("facts", [])],
        )

    def extend(self, other: Bundle) -> None:
        self.checks.extend(other.checks)
        self.notes.extend(other.notes)
        self.facts.extend(other.facts)


class ResultSink:
    """What the ``sharedkv_results`` fixture hands a test: add checks, notes and facts."""

    def __init__(self, nodeid: str, bundle: Bundle) -> None:
        self.nodeid = nodeid
        self.bundle = bundle

    def check(
        self,
        tier: str,
        key: dict[str, str],
        passed: int,
        trials: int,
        *,
        role: str = "check",
        message: str = "",
        detail: dict[str, Any] | None = None,
        kind: str = "check",
        status: str = "",
    ) -> Check:
        record = Check(
            tier=tier, key=dict(key), passed=passed, trials=trials, role=role,
            message=message, detail=dict(detail or {}), nodeid=self.nodeid, kind=kind,
            status=status,
        )
        self.bundle.checks.append(record)
        return record

    def note(self, tier: str, text: str, level: str = "info", *, kind: str = "note",
             status: str = "info") -> Note:
        record = Note(tier=tier, text=text, level=level, nodeid=self.nodeid, kind=kind,
                      status=status)
        self.bundle.notes.append(record)
        return record

    def fact(self, name: str, value: str) -> Fact:
        record = Fact(name=name, value=value, nodeid=self.nodeid)
        self.bundle.facts.append(record)
        return record
