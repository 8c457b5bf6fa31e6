"""Loading and validating the two reports: anything that is not a comparable sharedkv
JSON report is a ``CompareError`` naming the file (exit status 2), never a traceback. Both
sides are read alike (``schema``): a file of another tool, or a report that lacks what its
schema holds, is refused on either side, never read as a report without failures."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.cli.compare.schema import REPORT_SCHEMA, SchemaError, validate, version
from pytest_sharedkv.perf.observations import PerfReportError, from_json
from pytest_sharedkv.perf.statistics import Analysis, analyse


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
    except RecursionError:  # '[' * 100000: no report nests that deep
        raise CompareError(f"{path}: not a sharedkv JSON report (nested too deeply to "
                           "read)") from None
    if not isinstance(data, dict):
        raise CompareError(f"{path}: not a sharedkv JSON report (the top level is a "
                           f"{type(data).__name__}, not an object)")
    try:
        known = version(data) == 1  # a newer schema is named by ``comparable``
    except SchemaError as exc:
        raise CompareError(f"{path}: {exc}") from None
    perf = None
    if data.get("perf") is not None:
        try:
            run = from_json(data["perf"])
        except PerfReportError as exc:
            raise CompareError(f"{path}: {exc}") from None
        if not run.observations:
            raise CompareError(f"{path}: perf.observations: empty (a screening that timed no "
                               "request has nothing to compare or merge)")
        perf = analyse(run)
    if known:
        try:
            validate(data)
        except SchemaError as exc:
            raise CompareError(f"{path}: {exc}") from None
    return Report(path, data, perf)


def same_file(a: Path, b: Path) -> bool:
    """A and B name one file (the same path, a symlink or a hard link to it)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


SAME = "SAME REPORT"


def same_line(before: Report, after: Report) -> str:
    """A line where BEFORE and AFTER are one report (one file, or a copy of it under
    another name); "" where they are two. The compare still runs: a report against itself
    lists what it holds (its failures, as also in BEFORE), the sanity check of a report;
    it compares no upgrade, and the line says so."""
    if same_file(before.path, after.path):
        how = f"one file ({after.path})"
    elif before.data == after.data:
        how = f"one report under two names (created {after.data.get('created', '?')})"
    else:
        return ""
    return (f"{SAME}: BEFORE and AFTER are {how}: the report is compared with itself, so "
            "this says what it holds, not what an upgrade changed")


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
    """Raise CompareError naming a report that holds no test (a run that collected or ran
    none: nothing to compare), or saying which identity differs, with both values."""
    for role, report in (("BEFORE", before), ("AFTER", after)):
        if not report.data.get("tests"):
            raise CompareError(f"{report.path}: {role} holds no test (a run that collected "
                               "or ran none, such as --co or a -m that matched nothing): "
                               "there is nothing to compare")
    b, a = before.data.get("schema"), after.data.get("schema")
    if b != a:
        raise CompareError(f"incomparable reports: schema differs: BEFORE {b!r}, AFTER {a!r}")
    if b != REPORT_SCHEMA:  # read_report refused any other tool's file
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

