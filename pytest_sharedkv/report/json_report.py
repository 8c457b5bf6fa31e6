"""The ``--sharedkv-json`` report: every test result and every record of the run.

Only the process that owns the run writes it (the xdist controller, or the single process
without xdist); the file is written to a temporary name and renamed, so a reader never
sees half a report. It is rewritten as the run goes (``"complete": false``, no exit
status) and a last time at the end, so a run that is killed leaves what it had.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_sharedkv.report.run_log import RunLog
from pytest_sharedkv.version import __version__

SCHEMA = "pytest-sharedkv/1"


def check_writable(path: Path) -> str | None:
    """Why PATH cannot take the report, or None; checked before any test, so a path that
    cannot be written is a usage error, not a report that lands elsewhere. Its directory
    is made now (the first write would make it) and a file is made and removed there:
    permission bits do not tell (root passes os.access on a read-only /proc)."""
    if path.is_dir():
        return "it is a directory"
    parent = path.parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"its directory {parent} cannot be made ({exc.strerror or exc})"
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    except OSError as exc:
        return f"no file can be made in {parent} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def build(log: RunLog, environment: dict[str, Any], exitstatus: int | None,
          complete: bool = False) -> dict[str, Any]:
    """The report; ``complete`` only for a run that ended without being interrupted."""
    tiers = _ordered_unique(r.tier for r in log.tests.values() if r.tier is not None)
    perf = {"perf": log.perf} if log.perf is not None else {}
    return {
        "schema": SCHEMA,
        "plugin_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "complete": complete and log.interrupted is None,
        "interrupted": log.interrupted,
        "exitstatus": exitstatus,
        "environment": environment,
        "summary": log.counts(),
        "tiers": {t: {"summary": log.counts(t), "wall_s": log.wall_s(t)} for t in tiers},
        "tests": [{k: v for k, v in asdict(r).items() if k != "categories"}
                  for r in log.tests.values()],
        "collection": [{"nodeid": n, "outcome": c, "message": m} for n, c, m in log.collection],
        "checks": [c.to_data() for c in log.bundle.checks],
        "notes": [n.to_data() for n in log.bundle.notes],
        "facts": [asdict(f) for f in log.bundle.facts],
        **perf,  # the perf tier's screening (pytest_sharedkv.perf.observations.PerfRun)
    }


def _ordered_unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


NO_TESTS_SUFFIX = ".no-tests"  # beside a kept report: sharedkv-report.no-tests.json


def ran_tests(path: Path) -> bool:
    """Whether PATH holds a sharedkv report of a run that ran (or collected) a test."""
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and str(data.get("schema", "")).startswith(
        "pytest-sharedkv/") and bool(data.get("tests"))


def destination(path: Path, data: dict[str, Any]) -> tuple[Path, str]:
    """Where DATA goes, and what the line that names it adds. A report of a run that ran
    no sharedkv test (``--co``, a ``-m`` that matched nothing, a mistyped test path) never
    replaces one of a run that did: "run, upgrade, run, compare BEFORE AFTER" keeps its
    BEFORE. It goes beside it (``NAME.no-tests.json``), or nowhere where that too holds
    a run's tests."""
    if data.get("tests") or not ran_tests(path):
        return path, ""
    beside = path.with_name(path.stem + NO_TESTS_SUFFIX + path.suffix)
    kept = f" (this run ran no sharedkv test; {path}, a run that did, is kept)"
    return (path, kept) if ran_tests(beside) else (beside, kept)


def write_or_fallback(path: Path, data: dict[str, Any], named_by: str = "--sharedkv-json") -> str:
    """Write the report at the end of the run; PATH was writable when the run began
    (check_writable), so a failure now (a full disk, a directory removed meanwhile) must
    not lose it: it goes to the temp dir instead. Returns the line that says where it is.
    NAMED_BY is where PATH came from (the option or its ini key). A run that ran no test
    writes beside a report of one that did (``destination``)."""
    target, kept = destination(path, data)
    if kept and target == path:
        return f"JSON report: not written{kept}"
    path = target
    try:
        write(path, data)
        return f"JSON report: {path}{kept}"
    except OSError as exc:
        fallback = Path(tempfile.gettempdir()) / f"sharedkv-report-{os.getpid()}.json"
        try:
            write(fallback, data)
        except OSError as exc2:
            return f"{named_by}: could not write {path} ({exc}) nor {fallback} ({exc2})"
        return f"{named_by}: could not write {path} ({exc}); the report is at {fallback}"
