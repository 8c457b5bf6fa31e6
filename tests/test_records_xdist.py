"""Records under xdist when the run is interrupted: a worker's records of a test that never
reports (the records it flushed and those it had not) reach the controller's JSON report,
each once, through the worker's spool (``report/spool.py``); and a run that ends cleanly
keeps each record once, though its workers spooled the flushed ones too.

The interrupted run is tests/test_signals_xdist.py's: an inner ``pytest -n 2`` whose two
workers are each inside a test when the controller alone is signalled, here on the stub
provider, with tests that record a cell, flush it, record another and sleep.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from pytest_sharedkv.host.runtime_dir import RUNTIME_DIR_ENV
from tests.test_signals_xdist import signal_controller

# Each test records a cell and flushes it (a catalogue cell judged), records another it
# never flushes, says it started (PID-I) and sleeps, unless SLEEP_S says otherwise.
RECORDING = """
import os, time
import pytest

@pytest.mark.ordering
@pytest.mark.parametrize("i", range(4))
def test_sleep(i, sharedkv_results):
    sharedkv_results.check("selftest", {"cell": f"{i}-flushed"}, 1, 1)
    sharedkv_results.flush()
    sharedkv_results.check("selftest", {"cell": f"{i}-unflushed"}, 1, 1)
    ready = os.environ.get("READY_DIR")
    if ready:
        open(os.path.join(ready, f"{os.getpid()}-{i}"), "w").close()
    time.sleep(float(os.environ.get("SLEEP_S", "60")))
"""
ARGS = ("--sharedkv-provider=stub", "--sharedkv-json=t.json")
# The inner controller's last look at its workers' spool, before it merges and removes it.
SPOOL_SEEN = """
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return
    from pytest_sharedkv.report.spool import directory
    from pytest_sharedkv.state import state_of

    where = directory(state_of(session.config).records_run)
    with open("spooled.jsonl", "w") as out:
        out.writelines(p.read_text() for p in where.glob("*.jsonl"))
"""


def _run_dirs() -> list[Path]:
    """The runs' spool directories left in this test's runtime directory."""
    records = Path(os.environ[RUNTIME_DIR_ENV]) / "records"
    return list(records.iterdir()) if records.exists() else []


def _cells(report: dict[str, object]) -> Counter[str]:
    checks = report["checks"]
    assert isinstance(checks, list)
    return Counter(c["key"]["cell"] for c in checks)


def _started(ready: Path) -> set[str]:
    return {p.name.split("-")[1] for p in ready.iterdir() if p.name.split("-")[0].isdigit()}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_test_interrupted_mid_call_keeps_its_records(
        pytester: pytest.Pytester, sig: signal.Signals) -> None:
    """SIGTERM (or SIGINT) to the controller alone while each worker sleeps in a test that
    flushed one cell and holds another: both cells of both tests are in the report, once
    each, and those tests are the unfinished ones (no outcome), as a run without xdist
    reports a test interrupted mid-call."""
    run = signal_controller(pytester.path, sig, *ARGS, source=RECORDING)
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.text[-3000:]
    ready = next(pytester.path.glob("ready-*"))
    started = _started(ready)
    assert len(started) == 2, started
    report = json.loads(run.report.read_text())
    assert report["complete"] is False and report["interrupted"], report["interrupted"]
    assert _cells(report) == Counter(f"{i}-{what}" for i in started
                                     for what in ("flushed", "unflushed")), run.text[-3000:]
    unfinished = {t["nodeid"].rsplit("[", 1)[-1].rstrip("]"): t for t in report["tests"]
                  if t["outcome"] is None}
    assert set(unfinished) == started, report["tests"]
    assert {c["nodeid"] for c in report["checks"]} == {t["nodeid"]
                                                       for t in unfinished.values()}
    assert all(t["tier"] == "ordering" and t["worker"] for t in unfinished.values())
    assert _run_dirs() == []  # the run's spool went with it


def test_a_clean_xdist_run_keeps_each_record_once(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The flushed cells travel with their reports and are spooled as well: the report
    has every cell once, the spool had the flushed ones, and it is gone after the run."""
    monkeypatch.setenv("SLEEP_S", "0")
    monkeypatch.delenv("READY_DIR", raising=False)
    pytester.makepyfile(test_recording=RECORDING)
    pytester.makeconftest(SPOOL_SEEN)
    basetemp = pytester.path / "bt"
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider",
                                           f"--basetemp={basetemp}", *ARGS)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=4)
    report = json.loads((pytester.path / "t.json").read_text())
    assert report["complete"] is True
    assert _cells(report) == Counter(f"{i}-{what}" for i in range(4)
                                     for what in ("flushed", "unflushed"))
    spooled = [json.loads(line) for line in
               (pytester.path / "spooled.jsonl").read_text().splitlines()]
    assert sorted(e["record"]["key"]["cell"] for e in spooled) == [
        f"{i}-flushed" for i in range(4)]
    assert _run_dirs() == []
