"""The perf tier's lines in the terminal summary: the screening's Markdown tables and
verdicts (``perf.tables``), from the run the JSON report holds under "perf"."""

from __future__ import annotations

from pytest_sharedkv.report.run_log import RunLog


def summary_lines(log: RunLog) -> list[str]:
    if log.perf is None:
        return []
    from pytest_sharedkv.perf.observations import PerfReportError, from_json

    try:
        run = from_json(log.perf)
    except PerfReportError as exc:
        return [f"the screening's record cannot be read: {exc}"]
    try:
        from pytest_sharedkv.perf.statistics import analyse
        from pytest_sharedkv.perf.tables import report_lines
    except ImportError as exc:
        return [f"no tables: {exc}"]
    return report_lines(analyse(run))
