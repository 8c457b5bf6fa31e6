"""Result records: what every tier reports, in a form that crosses xdist as plain data.

A test appends ``Check`` records through the ``sharedkv_results`` fixture; the plugin
moves them onto the test report's ``user_properties`` (which xdist already serialises),
and the controller gathers them for the terminal tables and the JSON report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ROLES = ("control", "negative-control", "under-test", "check")
# detail["status"] of a check whose result proves nothing (its probe, gate or audit could
# not have seen a fault): the run's verdict reads this, never the message.
VOID = "VOID"


@dataclass
class Check:
    """One cell of a tier's matrix: ``passed`` of ``trials`` checks held.

    ``key`` names the cell (e.g. target, direction, size, delay); ``role`` says whether
    the thing checked is a control, the negative control or the thing under test;
    ``detail`` carries the evidence (first mismatching offset, bytes, timings).
    """

    tier: str
    key: dict[str, str]
    passed: int
    trials: int
    role: str = "check"
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    nodeid: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {self.role!r}")
        if not 0 <= self.passed <= self.trials:
            raise ValueError(f"passed={self.passed} must lie in 0..trials={self.trials}")

    @property
    def ok(self) -> bool:
        return self.passed == self.trials

    @property
    def void(self) -> bool:
        return self.detail.get("status") == VOID


@dataclass
class Note:
    """A line a tier wants under its table (a verdict, a sensitivity warning, a rate)."""

    tier: str
    text: str
    level: str = "info"  # info | warning | verdict
    nodeid: str = ""


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
    ) -> Check:
        record = Check(
            tier=tier, key=dict(key), passed=passed, trials=trials, role=role,
            message=message, detail=dict(detail or {}), nodeid=self.nodeid,
        )
        self.bundle.checks.append(record)
        return record

    def note(self, tier: str, text: str, level: str = "info") -> Note:
        record = Note(tier=tier, text=text, level=level, nodeid=self.nodeid)
        self.bundle.notes.append(record)
        return record

    def fact(self, name: str, value: str) -> Fact:
        record = Fact(name=name, value=value, nodeid=self.nodeid)
        self.bundle.facts.append(record)
        return record
