"""Loading and validating the two reports: anything that is not a comparable sharedkv
JSON report is a ``CompareError`` naming the file (exit status 2), never a traceback."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.perf.observations import PerfReportError, from_json
from pytest_sharedkv.perf.statistics import Analysis, analyse

REPORT_SCHEMA = "pytest-sharedkv/1"  # report_json.SCHEMA, without importing the plugin


class CompareError(Exception):
    """Exit status 2: a usage error or reports that cannot be compared."""



@dataclass
class Report:
    path: Path
    data: dict[str, Any]
    perf: Analysis | None


def read_report(path: Path) -> Report:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CompareError(f"{path}: is a directory, not a JSON report") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                           f"{exc.msg})") from None
    if not isinstance(data, dict):
        raise CompareError(f"{path}: not a sharedkv JSON report (the top level is a "
                           f"{type(data).__name__}, not an object)")
    perf = None
    if data.get("perf") is not None:
        try:
            perf = analyse(from_json(data["perf"]))
        except PerfReportError as exc:
            raise CompareError(f"{path}: {exc}") from None
    for name in ("tests", "checks", "notes", "collection"):
        if not isinstance(data.get(name, []), list):
            raise CompareError(f"{path}: {name} is not a list")
    for name in ("checks", "notes"):  # what a verdict is read from must be plain text
        for index, record in enumerate(data.get(name, [])):
            for field in ("kind", "status"):
                value = record.get(field, "") if isinstance(record, dict) else ""
                if not isinstance(value, str):
                    raise CompareError(f"{path}: {name}[{index}].{field}: expected a string, "
                                       f"found {type(value).__name__}")
    return Report(path, data, perf)


def environment_of(report: Report, name: str) -> Any:
    """``environment.NAME`` of REPORT; None where the report has no environment or no NAME."""
    environment = report.data.get("environment")
    return environment.get(name) if isinstance(environment, dict) else None


def setting_of(report: Report, name: str) -> Any:
    """The run's ``--sharedkv-*`` setting NAME (``environment.settings``); None where the
    report did not record it."""
    settings = environment_of(report, "settings")
    return settings.get(name) if isinstance(settings, dict) else None


def tiers(report: Report) -> set[str]:
    """The tiers whose tests the report holds (none known for a report without the field)."""
    found = report.data.get("tiers")
    return set(found) if isinstance(found, dict) else set()


def comparable(before: Report, after: Report) -> None:
    """Raise CompareError saying which identity differs, with both values."""
    b, a = before.data.get("schema"), after.data.get("schema")
    if b != a:
        raise CompareError(f"incomparable reports: schema differs: BEFORE {b!r}, AFTER {a!r}")
    if b != REPORT_SCHEMA:
        raise CompareError(f"incomparable reports: schema {b!r} is not {REPORT_SCHEMA!r} "
                           "(a newer plugin wrote them)")
    b_tiers, a_tiers = tiers(before), tiers(after)
    if b_tiers and a_tiers and not b_tiers & a_tiers:
        raise CompareError(f"incomparable reports: no tier in common: BEFORE ran "
                           f"{', '.join(sorted(b_tiers))}, AFTER ran "
                           f"{', '.join(sorted(a_tiers))} (run both with the same -m)")
    if (before.perf is None) != (after.perf is None):
        has, lacks = ("BEFORE", "AFTER") if after.perf is None else ("AFTER", "BEFORE")
        raise CompareError(f"incomparable reports: {has} holds a perf screening and {lacks} "
                           "none (run both with the perf tier)")
    if before.perf is None or after.perf is None:
        return
    for name in ("schema", "model_digest", "corpus_digest"):
        b, a = getattr(before.perf.run, name), getattr(after.perf.run, name)
        if b != a:
            what = {"schema": "perf schema", "model_digest": "model digest",
                    "corpus_digest": "corpus digest"}[name]
            raise CompareError(f"incomparable reports: {what} differs: BEFORE {b!r}, "
                               f"AFTER {a!r}")

