"""Result records: what every tier reports, in a form that crosses xdist as plain data.

A test appends ``Check`` records through the ``sharedkv_results`` fixture; the plugin
moves them onto the test report's ``user_properties`` (which xdist already serialises),
and the controller gathers them for the terminal tables and the JSON report. A test that
runs for long can hand what it has recorded so far to the run at once
(``ResultSink.flush``), so a run cut short still reports it; an xdist worker keeps them for
its report and spools them (``spool.py``), which the controller merges where no report came.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Self, TypeVar


class Word(str, Enum):
    """A record's word: a ``str`` that compares, hashes and serialises as its text, so the
    JSON and every reader that compares with a string see what they saw before."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Role(Word):
    """Whether the thing a record checked is a control, the negative control or the thing
    under test."""

    CONTROL = "control"
    NEGATIVE_CONTROL = "negative-control"
    UNDER_TEST = "under-test"
    CHECK = "check"


class Kind(Word):
    """What a record found wrong or, when it found nothing wrong, what it checks.
    ``compare`` reads kind and status, never the message, so rewording a message cannot
    change a verdict."""

    CHECK = "check"  # a cell whose passed/trials is the whole verdict (the default)
    GATE = "gate"  # the service tier's sensitivity gate (the negative control of a launched run)
    DIVERGENCE = "divergence"  # an answer that is not the right one
    # a cache hit across cache_salt namespaces (a cold request that hit, in any stage; an
    # audited load of a chunk its salt never stored): tenants are not isolated, a security
    # failure named before any answer (reports before issue 52 called it "leak")
    ISOLATION = "isolation"
    LEAK = "leak"  # an older report's word for the same failure (read, no longer written)
    HITS = "hits"  # hits that are not the kind or number a step may have
    HITS_UNKNOWN = "hits-unknown"  # the engine reports no hit counter: hits cannot be counted
    AUDIT_MISMATCH = "audit-mismatch"  # KV bytes B loaded differ from what A stored
    PROTOCOL = "protocol"  # an OpenAI-protocol property clients depend on
    SESSION = "session"  # a multi-turn session (exact answers, hits)
    ERROR = "error"  # a request or process failed, so nothing was judged
    MODEL_SENSITIVITY = "model-sensitivity"  # the copy model's corruption matrix
    ORDERING = "ordering"  # a stream-ordering probe cell
    BYTES = "bytes"  # a byte-exact KV round trip (packed_page, the transfer pair)
    PINNED = "pinned"  # a pinned-pool allocation route
    TRIAGE = "triage"  # a triage cell (pass: its control removed the fault; fail: it showed)
    TRIAGE_VERDICT = "triage-verdict"  # the class of fault the triage's cells name
    # a fault catalogue cell: one fault class injected, and which checks caught it (pass:
    # seen as its class expects; fail: applied and seen by nothing, or a control caught)
    FAULT_CATALOGUE = "fault-catalogue"
    # the identity tier: a hit across model identities (adapter, weights, RoPE, kv dtype,
    # chunk, release, a restart's changed configuration) that answered wrong
    IDENTITY = "identity"
    NOTE = "note"  # a note's default: it judges nothing


class Status(Word):
    """pass/fail: whether the record's checks held (for an ordering negative control under
    delay a fail is what shows the probe is sensitive: read ``role``); void: the record
    proves nothing (the gate or delay never acted); confounded: the gate's corruption may
    have been undone by the fault under test; unproven: nothing could be injected; xfail: a
    combination refused by design; unknown: a counter the verdict needs could not be read;
    info: recorded, judges nothing (warm-ups, notes). A record's ``status`` is the one place
    a reader learns this: ``detail`` may carry a tier's own finer word (the gate's
    "proven"/"VOID"/"CONFOUNDED"), but no verdict is read from it."""

    PASS = "pass"
    FAIL = "fail"
    VOID = "void"
    CONFOUNDED = "confounded"
    UNPROVEN = "unproven"
    UNKNOWN = "unknown"
    XFAIL = "xfail"
    INFO = "info"


ROLES = tuple(r.value for r in Role)
KINDS = tuple(k.value for k in Kind)
STATUSES = tuple(s.value for s in Status)
# When one record found several things, the kind it carries (the first here wins).
PRECEDENCE = ("isolation", "leak", "divergence", "audit-mismatch", "hits-unknown", "hits", "error")
W = TypeVar("W", bound=Word)


def worst_kind(kinds: Iterable[str], default: str) -> str:
    """The kind a record that found KINDS carries (see PRECEDENCE); DEFAULT if none."""
    found = set(kinds)
    return next((k for k in PRECEDENCE if k in found), default)


def _word(cls: type[W], value: W | str, what: str) -> W:
    """VALUE as a member of CLS; ValueError naming WHAT and the words it may be."""
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {tuple(w.value for w in cls)}, not "
                         f"{value!r}") from None


def _plain(record: Any) -> dict[str, Any]:
    """RECORD's fields as plain data (a word as its text): what xdist and JSON carry."""
    return {k: v.value if isinstance(v, Word) else v for k, v in asdict(record).items()}


class Problem(str):
    """The suite's one problem type: its text (what a test shows and joins) that knows its
    kind, which verdicts read, never the text. A subclass names a family of problems and
    its kind (``KIND``); a plain str is a problem of no known kind."""

    KIND = "problem"
    kind: str

    def __new__(cls, text: str, kind: str | None = None) -> Self:
        self = super().__new__(cls, text)
        self.kind = cls.KIND if kind is None else kind
        return self

    @property
    def message(self) -> str:
        return str(self)

    def record(self) -> dict[str, str]:
        """As the JSON report keeps it."""
        return {"kind": str(self.kind), "message": str(self)}


def kinds_of(problems: Iterable[str]) -> list[str]:
    """The kinds of PROBLEMS (a plain string has none)."""
    return [p.kind for p in problems if isinstance(p, Problem)]


@dataclass(init=False)
class Check:
    """One cell of a tier's matrix: ``passed`` of ``trials`` checks held.

    ``key`` names the cell (e.g. target, direction, size, delay); ``role`` says whether
    the thing checked is a control, the negative control or the thing under test;
    ``detail`` carries the evidence (first mismatching offset, bytes, timings); ``kind``
    and ``status`` are what a reader judges by. They are given as words or their text
    and always held as words; an empty status is pass when every trial held, else fail.
    """

    tier: str
    key: dict[str, str]
    passed: int
    trials: int
    role: Role = Role.CHECK
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    nodeid: str = ""
    kind: Kind = Kind.CHECK
    status: Status = Status.PASS

    def __init__(self, tier: str, key: dict[str, str], passed: int, trials: int,
                 role: Role | str = Role.CHECK, message: str = "",
                 detail: dict[str, Any] | None = None, nodeid: str = "",
                 kind: Kind | str = Kind.CHECK, status: Status | str = "") -> None:
        self.tier, self.key, self.passed, self.trials = tier, key, passed, trials
        self.message, self.detail, self.nodeid = message, {} if detail is None else detail, nodeid
        self.kind = _word(Kind, kind, "kind")
        self.status = _word(Status, status or (Status.PASS if self.ok else Status.FAIL),
                            "status")
        self.role = _word(Role, role, "role")
        if not 0 <= passed <= trials:
            raise ValueError(f"passed={passed} must lie in 0..trials={trials}")

    @property
    def ok(self) -> bool:
        return self.passed == self.trials

    @property
    def void(self) -> bool:
        """The record proves nothing (its probe, gate or audit could not have seen a fault)."""
        return self.status is Status.VOID

    def to_data(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(init=False)
class Note:
    """A line a tier wants under its table (a verdict, a sensitivity warning, a rate)."""

    tier: str
    text: str
    level: str = "info"  # info | warning | verdict
    nodeid: str = ""
    kind: Kind = Kind.NOTE
    status: Status = Status.INFO  # void: the note says a result proves nothing

    def __init__(self, tier: str, text: str, level: str = "info", nodeid: str = "",
                 kind: Kind | str = Kind.NOTE, status: Status | str = Status.INFO) -> None:
        self.tier, self.text, self.level, self.nodeid = tier, text, level, nodeid
        self.kind = _word(Kind, kind, "kind")
        self.status = _word(Status, status, "status")

    def to_data(self) -> dict[str, Any]:
        return _plain(self)


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
            "checks": [c.to_data() for c in self.checks],
            "notes": [n.to_data() for n in self.notes],
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
    """What the ``sharedkv_results`` fixture hands a test: add checks, notes and facts.

    DELIVER, where given, takes records before the test's report and says whether it kept
    them (the process that keeps the run's log does; an xdist worker has none)."""

    def __init__(self, nodeid: str, bundle: Bundle,
                 deliver: Callable[[Bundle], bool] | None = None) -> None:
        self.nodeid = nodeid
        self.bundle = bundle
        self.deliver = deliver

    def flush(self) -> bool:
        """Hand the records made so far to the run now (the JSON report is rewritten with
        them), so a run killed before this test reports still has them; each goes once.
        False where they stay for the test's report, as every record did (xdist workers,
        whose DELIVER spools them for a controller that never gets that report)."""
        if not self.bundle or self.deliver is None:
            return False
        held = Bundle(list(self.bundle.checks), list(self.bundle.notes),
                      list(self.bundle.facts))
        if not self.deliver(held):
            return False
        for records in (self.bundle.checks, self.bundle.notes, self.bundle.facts):
            records.clear()
        return True

    def check(
        self,
        tier: str,
        key: dict[str, str],
        passed: int,
        trials: int,
        *,
        role: Role | str = Role.CHECK,
        message: str = "",
        detail: dict[str, Any] | None = None,
        kind: Kind | str = Kind.CHECK,
        status: Status | str = "",
    ) -> Check:
        record = Check(
            tier=tier, key=dict(key), passed=passed, trials=trials, role=role,
            message=message, detail=dict(detail or {}), nodeid=self.nodeid, kind=kind,
            status=status,
        )
        self.bundle.checks.append(record)
        return record

    def note(self, tier: str, text: str, level: str = "info", *, kind: Kind | str = Kind.NOTE,
             status: Status | str = Status.INFO) -> Note:
        record = Note(tier=tier, text=text, level=level, nodeid=self.nodeid, kind=kind,
                      status=status)
        self.bundle.notes.append(record)
        return record

    def fact(self, name: str, value: str) -> Fact:
        record = Fact(name=name, value=value, nodeid=self.nodeid)
        self.bundle.facts.append(record)
        return record
