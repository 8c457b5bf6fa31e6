"""An xdist worker's records on disk, for the controller to keep when their report never
comes.

Records travel from a worker to the controller on the test's report (``user_properties``).
A test interrupted mid-call (SIGTERM or SIGINT, which the controller passes on) gets no
report, and reports still on their way when the controller is interrupted are never read,
so those records would be lost. A worker therefore also writes them here: the records a
test hands over early (``ResultSink.flush``) as it does, and, when a test is interrupted,
the records it had not handed over. Each worker appends JSON lines, one a record with an
id of its own, to ``<run dir>/<worker>-<pid>.jsonl``: the run's own directory,
``records/<controller pid>-<xdist's testrunuid>`` in the shared runtime directory (0700,
this user's; ``host/runtime_dir.py``), named by the controller to each worker on this
machine through ``workerinput`` in ``pytest_configure_node`` and made by the worker's first
record, so a run that records nothing writes nothing. The report that
does carry spooled records names their ids (``fields.SPOOLED_ATTRIBUTE``), and the
controller merges, at session finish and at its last report of an unfinished run, only the
records whose ids no report brought: a record is counted once, whichever way it came.
The controller removes the run's directory when it ends, and any other run's that nothing
has touched for a week (its controller was killed; a pid says nothing where containers
share the runtime directory).

When the run was interrupted the controller first waits, briefly, until each worker it
knows has ended its session (a ``.done`` file beside its records) or is gone, since each
writes its interrupted test's records only once the signal reaches it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_sharedkv.host.runtime_dir import RuntimeDirError, subdir
from pytest_sharedkv.report.records import Bundle, Check, Fact, Note
from pytest_sharedkv.report.run_log import RunLog, TestResult

SUBDIR = "records"  # in the runtime directory: one directory a run
STALE_S = 7 * 24 * 3600.0  # another run's directory untouched this long is a killed run's
# how long an interrupted controller waits for its workers' last records: half the 10 s an
# interrupted run has to exit in (docs/gpus-and-processes.md)
WAIT_S = 5.0

Record = Check | Note | Fact
_SECTIONS = (("check", Check), ("note", Note), ("fact", Fact))


def _stem(worker: str) -> str:
    return f"{worker}-{os.getpid()}"


def directory(run: str) -> Path:
    """RUN's directory (not made here; the shared one above it is); RuntimeDirError or
    OSError where the runtime directory cannot be used."""
    return subdir(SUBDIR) / run


def _records(bundle: Bundle) -> Iterable[tuple[str, Record]]:
    for section, records in (("check", bundle.checks), ("note", bundle.notes),
                             ("fact", bundle.facts)):
        for record in records:
            yield section, record


class Spool:
    """One worker's spool: which of its current test's records it has written, by id."""

    def __init__(self, run: str, worker: str) -> None:
        self.run = run
        self.worker = worker
        # since the test's last report: id(record) -> (record, its spool id)
        self.written: dict[int, tuple[Record, str]] = {}
        self.broken = False  # a write failed: records still travel with their reports

    def write(self, nodeid: str, tier: str | None, bundle: Bundle, interrupted: bool = False
              ) -> None:
        """Append BUNDLE's records not yet written (each once, however often flushed)."""
        lines = []
        for section, record in _records(bundle):
            if id(record) in self.written:
                continue
            record_id = uuid.uuid4().hex
            lines.append(json.dumps({
                "id": record_id, "nodeid": nodeid, "tier": tier, "worker": self.worker,
                "interrupted": interrupted, "section": section,
                "record": record.to_data() if not isinstance(record, Fact) else vars(record),
            }, default=str))
            self.written[id(record)] = (record, record_id)
        if not lines or self.broken:
            return
        try:
            path = directory(self.run)
            path.mkdir(mode=0o700, exist_ok=True)
            with (path / f"{_stem(self.worker)}.jsonl").open("a") as out:
                out.write("".join(line + "\n" for line in lines))
        except (OSError, RuntimeDirError):
            self.broken = True

    def reported(self) -> list[str]:
        """The ids of the records written since the last report: the report now made
        carries them all (the test's bundle goes on it whole); forgotten here."""
        ids = [record_id for _, record_id in self.written.values()]
        self.written = {}
        return ids


def finished(run: str, worker: str) -> None:
    """On a worker of an active run, as its session ends: nothing more will be written."""
    with contextlib.suppress(OSError, RuntimeDirError):
        path = directory(run)
        path.mkdir(mode=0o700, exist_ok=True)
        (path / f"{_stem(worker)}.done").touch()


def remove(run: str) -> None:
    """On the controller, once its workers are down: RUN's directory goes, and so does any
    other run's left for a week (its controller killed before it could remove its own)."""
    with contextlib.suppress(OSError, RuntimeDirError):
        now = time.time()
        for path in subdir(SUBDIR).iterdir():
            if path.name == run or now - _touched(path) > STALE_S:
                shutil.rmtree(path, ignore_errors=True)


def _touched(path: Path) -> float:
    """When anything in PATH was last written (now, where it cannot be read)."""
    try:
        return max([path.stat().st_mtime, *(p.stat().st_mtime for p in path.iterdir())])
    except OSError:
        return time.time()


def wait_for_workers(directory: Path, workers: Mapping[str, int],
                     timeout: float = WAIT_S) -> None:
    """Until each of WORKERS (id -> pid) has said its session ended or is gone."""
    deadline = time.monotonic() + timeout
    waiting = dict(workers)
    while waiting and time.monotonic() < deadline:
        for worker, pid in list(waiting.items()):
            if (directory / f"{worker}-{pid}.done").exists() or not _alive(pid):
                del waiting[worker]
        if waiting:
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    """PID runs: a zombie has ended (a worker that died without ending its session stays
    one until execnet reaps it, and ``kill(pid, 0)`` still finds it: the controller then
    waited the whole WAIT_S for it, issue 52's 16.8 s exit)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = None
    if state is not None:
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)  # no /proc: existence is all that can be told
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _lines(directory: Path) -> Iterable[dict[str, Any]]:
    for path in sorted(directory.glob("*.jsonl")):
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            with contextlib.suppress(ValueError):  # a line cut short by a kill
                entry = json.loads(line)
                if isinstance(entry, dict):
                    yield entry


def merge(log: RunLog, directory: Path) -> int:
    """Fold the spooled records no report brought into LOG (and each only once, however
    often this runs); a test known only from them is one that never reported an outcome.
    Returns how many were added."""
    if not directory.is_dir():
        return 0
    added = Bundle()
    for entry in _lines(directory):
        record_id = entry.get("id")
        if not isinstance(record_id, str) or record_id in log.received:
            continue
        kind = dict(_SECTIONS).get(entry.get("section", ""))
        data = entry.get("record")
        if kind is None or not isinstance(data, dict):
            continue
        try:
            record = kind(**data)
        except (TypeError, ValueError):
            continue
        log.received.add(record_id)
        if isinstance(record, Check):
            added.checks.append(record)
        elif isinstance(record, Note):
            added.notes.append(record)
        else:
            added.facts.append(record)
        nodeid = str(entry.get("nodeid", ""))
        if nodeid and nodeid not in log.tests:
            tier, worker = entry.get("tier"), entry.get("worker")
            log.tests[nodeid] = TestResult(nodeid, tier if isinstance(tier, str) else None,
                                           worker=worker if isinstance(worker, str) else None)
    log.bundle.extend(added)
    return len(added.checks) + len(added.notes) + len(added.facts)
