"""A committed report read as the product reads one: compare's reader (the schema checks,
the perf screening analysed), its records as the typed ``Check``, ``Note`` and ``Fact`` of
``report.records``, and a ``RunLog`` that the terminal summary renders, each tier through
its own ``TierReport``. The self-tests over recorded GPU runs assert on what these compute,
so a reader or renderer that misreads a real report fails there, not only an edited file."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from pytest_sharedkv.cli.compare.kernels import lmcache_of
from pytest_sharedkv.cli.compare.reading import Report, read_report
from pytest_sharedkv.report.records import Bundle, Check
from pytest_sharedkv.report.run_log import RunLog, TestResult
from pytest_sharedkv.report.terminal import TierReport, summary_lines

ROOT = Path(__file__).resolve().parents[1]
LMCACHE_H200 = ROOT / "fixtures" / "lmcache" / "h200"
LMCACHE_H100 = ROOT / "fixtures" / "lmcache" / "h100"
PERF_H200 = ROOT / "fixtures" / "perf" / "h200"


def read(path: Path) -> Report:
    """PATH through compare's reader: a report it refuses fails the test naming the field."""
    return read_report(path)


def records(report: Report) -> Bundle:
    """The report's checks, notes and facts as the records that wrote them (a kind or
    status this plugin does not know raises)."""
    return Bundle.from_data(report.data)


def checks(report: Report, tier: str) -> list[Check]:
    return [c for c in records(report).checks if c.tier == tier]


def run_log(report: Report) -> RunLog:
    """The run as the controller had gathered it when it wrote REPORT: each test's outcome
    (one category each: the report keeps no teardown error beside a failure), the
    records, the interruption, each tier's wall time and the perf screening."""
    data = report.data
    log = RunLog(bundle=records(report), perf=data.get("perf"),
                 interrupted=data.get("interrupted") or None)
    for test in data["tests"]:
        result = TestResult(test["nodeid"], test.get("tier"), test.get("outcome"),
                            float(test.get("duration") or 0.0), test.get("message", ""),
                            test.get("worker"), bool(test.get("require_gpu")),
                            test.get("params"))
        if result.outcome is not None:
            result.categories.append(result.outcome)
        log.tests[result.nodeid] = result
    log.collection = [(c["nodeid"], c["outcome"], c.get("message", ""))
                      for c in data.get("collection", [])]
    for tier, info in (data.get("tiers") or {}).items():
        if isinstance(info, dict) and info.get("wall_s") is not None:
            log.spans[tier] = [0.0, float(info["wall_s"])]
    return log


def tier_reports(report: Report) -> dict[str, TierReport]:
    """Each tier's part of the summary as its pytest module hands it over; the service tier
    with no baseline and the kernel path the report's run found."""
    from pytest_sharedkv.ordering.fixtures import pytest_sharedkv_tier_report as ordering
    from pytest_sharedkv.packed_page.fixtures import pytest_sharedkv_tier_report as packed
    from pytest_sharedkv.perf.fixtures import pytest_sharedkv_tier_report as perf
    from pytest_sharedkv.pinned_pool.fixtures import pytest_sharedkv_tier_report as pinned
    from pytest_sharedkv.replica_pair.fixtures import pytest_sharedkv_tier_report as pair
    from pytest_sharedkv.service import summary as service

    lmcache = lmcache_of(report) or {}
    found = [ordering(), packed(), perf(), pinned(), pair(),
             TierReport("service_regression", own_table=True,
                        lines=partial(service.summary_lines, baseline=None,
                                      kernel_path=lmcache.get("kernel_path")))]
    return {r.tier: r for r in found}


def summary(report: Report) -> list[str]:
    """The terminal's sharedkv summary of REPORT, rendered now."""
    return summary_lines(run_log(report), tier_reports(report))
