"""Everything a run produced, gathered from test reports (the same way with or without xdist).

Reports reach the controller's ``pytest_runtest_logreport`` once per phase; this folds the
phases of one test into one outcome and pulls the sharedkv records off ``user_properties``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_sharedkv.markers import TIER_MARKERS
from pytest_sharedkv.records import USER_PROPERTY, Bundle

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


@dataclass
class TestResult:
    nodeid: str
    tier: str | None
    outcome: str = "passed"
    duration: float = 0.0
    message: str = ""
    worker: str | None = None


def _message(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail) or "xfail"
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return report.longreprtext.strip().splitlines()[-1] if report.longreprtext else ""


def tier_of(keywords: Any) -> str | None:
    for name in TIER_MARKERS:
        if name in keywords:
            return name
    return None


@dataclass
class RunLog:
    tests: dict[str, TestResult] = field(default_factory=dict)
    bundle: Bundle = field(default_factory=Bundle)

    def add_report(self, report: pytest.TestReport) -> None:
        result = self.tests.get(report.nodeid)
        if result is None:
            result = TestResult(report.nodeid, tier_of(report.keywords),
                                worker=getattr(report, "worker_id", None))
            self.tests[report.nodeid] = result
        result.duration += float(getattr(report, "duration", 0.0) or 0.0)
        for name, value in report.user_properties:
            if name == USER_PROPERTY and isinstance(value, dict):
                self.bundle.extend(Bundle.from_data(value))
        outcome = _phase_outcome(report)
        if outcome is None:
            return
        # A failing teardown after a passing call makes the test an error; otherwise the
        # first decisive phase (setup or call) decides.
        if report.when == "teardown":
            if result.outcome in ("passed", "xpassed"):
                result.outcome, result.message = outcome, _message(report)
            return
        result.outcome, result.message = outcome, _message(report)

    def counts(self, tier: str | None = None) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        for result in self.tests.values():
            if tier is None or result.tier == tier:
                out[result.outcome] += 1
        return out


def _phase_outcome(report: pytest.TestReport) -> str | None:
    if hasattr(report, "wasxfail"):
        if report.skipped:
            return "xfailed"
        if report.passed:
            return "xpassed"
    if report.when == "call":
        return str(report.outcome)
    if report.failed:
        return "error"
    if report.skipped:
        return "skipped"
    return None
