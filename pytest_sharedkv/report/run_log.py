"""Everything a run produced, gathered from test reports (the same way with or without xdist).

Reports reach the controller's ``pytest_runtest_logreport`` once per phase. Counts use
pytest's own words and rules: every report is counted under the category pytest's
``pytest_report_teststatus`` gives it, as the terminal's last line does (a test that
fails and then errors in teardown is one failed and one error), so the two never
disagree. A test's outcome comes only from a report that decides it: a test whose setup
passed and whose call never reported (an interrupted run, a killed worker) has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_sharedkv.report.fields import (
    ITEM_PERF,
    PERF_ATTRIBUTE,
    REPORT_PARAMS,
    REPORT_TIER,
    REQUIRE_GPU_FLAG,
    SPOOLED_ATTRIBUTE,
    USER_PROPERTY,
)
from pytest_sharedkv.report.records import Bundle

# pytest's summary words (``RunResult.parseoutcomes``): its "error" category is "errors".
COUNT_KEYS = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")


def unreported_perf(items: list[pytest.Item]) -> dict[str, Any] | None:
    """The perf screening a test attached to its item and never reported: an interrupt
    (Ctrl-C, SIGTERM) ends the run before the test's call report, so what it measured is
    only on the item (this process's items: an xdist worker's are its own)."""
    for item in reversed(items):
        found = item.stash.get(ITEM_PERF, None)
        if found is not None:
            return found
    return None


def count_key(category: str) -> str:
    return "errors" if category == "error" else category


@dataclass
class TestResult:
    nodeid: str
    tier: str | None
    outcome: str | None = None  # pytest's word for the test; None until a report decides it
    duration: float = 0.0
    message: str = ""
    worker: str | None = None
    require_gpu: bool = False  # a gated skip failed by --sharedkv-require-gpu
    # the test's parameters by argument name (fields.params_of); None: not recorded (a
    # test of no tier, or a report written before they were)
    params: dict[str, Any] | None = None
    categories: list[str] = field(default_factory=list, repr=False)


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail) or "xfail"
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return report.longreprtext.strip().splitlines()[-1] if report.longreprtext else ""


@dataclass
class RunLog:
    tests: dict[str, TestResult] = field(default_factory=dict)
    bundle: Bundle = field(default_factory=Bundle)
    collection: list[tuple[str, str, str]] = field(default_factory=list)  # nodeid, category, why
    interrupted: str | None = None  # what stopped the run early, in pytest's words
    spans: dict[str, list[float]] = field(default_factory=dict)  # tier -> [first start, last stop]
    perf: dict[str, Any] | None = None  # the perf tier's PerfRun (JSON), the report's "perf"
    # ids of the records that reached this log and an xdist worker also spooled (spool.py)
    received: set[str] = field(default_factory=set, repr=False)

    def add_report(self, report: pytest.TestReport, category: str) -> None:
        """Fold one phase's report in; CATEGORY is what pytest_report_teststatus said."""
        result = self.tests.get(report.nodeid)
        tier = getattr(report, REPORT_TIER, None)
        if result is None:
            result = TestResult(report.nodeid, tier, worker=getattr(report, "worker_id", None))
            self.tests[report.nodeid] = result
        elif result.tier is None:
            result.tier = tier
        if result.params is None:
            params = getattr(report, REPORT_PARAMS, None)
            result.params = params if isinstance(params, dict) else None
        result.duration += float(getattr(report, "duration", 0.0) or 0.0)
        self._span(result.tier, report)
        for name, value in report.user_properties:
            if name == USER_PROPERTY and isinstance(value, dict):
                self.bundle.extend(Bundle.from_data(value))
        spooled = getattr(report, SPOOLED_ATTRIBUTE, None)
        if isinstance(spooled, list):
            self.received.update(str(i) for i in spooled)
        perf = getattr(report, PERF_ATTRIBUTE, None)
        if isinstance(perf, dict):
            self.perf = perf  # every phase's report after it was attached: the same value
        if not category:  # a setup or teardown that passed decides nothing
            return
        result.categories.append(category)
        if report.when == "teardown":
            # A failing teardown after a passing call makes the test an error.
            if result.outcome in (None, "passed", "xpassed"):
                result.outcome, result.message = category, _message(report)
            return
        required = getattr(report, REQUIRE_GPU_FLAG, None)
        result.outcome, result.message = category, required or _message(report)
        result.require_gpu = bool(required)

    def add_collect_report(self, report: pytest.CollectReport, category: str) -> None:
        """A module that failed or skipped at collection counts as pytest counts it."""
        if category:
            self.collection.append((report.nodeid, category, _message(report)))

    def _span(self, tier: str | None, report: pytest.TestReport) -> None:
        start = float(getattr(report, "start", 0) or 0)
        stop = float(getattr(report, "stop", 0) or 0)
        if tier is None or not start:
            return
        span = self.spans.setdefault(tier, [start, stop])
        span[0], span[1] = min(span[0], start), max(span[1], stop)

    def counts(self, tier: str | None = None) -> dict[str, int]:
        """Reports per pytest category (all tests, or one tier's), keyed as pytest says."""
        out = dict.fromkeys(COUNT_KEYS, 0)
        categories = [c for r in self.tests.values() if tier is None or r.tier == tier
                      for c in r.categories]
        if tier is None:
            categories += [c for _, c, _ in self.collection]
        for category in categories:
            key = count_key(category)
            out[key] = out.get(key, 0) + 1
        return out

    def unfinished(self, tier: str | None = None) -> list[TestResult]:
        """Tests that started but never reported an outcome (the run stopped under them)."""
        return [r for r in self.tests.values()
                if r.outcome is None and (tier is None or r.tier == tier)]

    def wall_s(self, tier: str) -> float | None:
        """Seconds from the tier's first test start to its last test end."""
        span = self.spans.get(tier)
        return None if span is None else span[1] - span[0]
