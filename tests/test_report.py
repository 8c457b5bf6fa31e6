"""Records reach the terminal tables and the JSON report, which only the controller writes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.report.json_report import write_or_fallback
from pytest_sharedkv.report.records import (
    KINDS,
    ROLES,
    STATUSES,
    Bundle,
    Check,
    Kind,
    Note,
    Role,
    Status,
)
from pytest_sharedkv.report.run_log import RunLog
from pytest_sharedkv.report.run_log import TestResult as Result
from pytest_sharedkv.report.spool import Spool, directory, merge
from pytest_sharedkv.report.terminal import TableSpec, check_table

RECORDING = """
import os
import pytest

@pytest.mark.ordering
@pytest.mark.parametrize("delay", ["0", "1e8"])
@pytest.mark.parametrize("size", ["4KiB", "1MiB"])
def test_cell(sharedkv_results, size, delay):
    ok = 10 if delay == "0" else 3
    sharedkv_results.check("ordering", {"target": "raw", "direction": "D2H", "size": size,
                           "delay": delay}, ok, 10, role="negative-control")
    sharedkv_results.fact("worker", os.environ.get("PYTEST_XDIST_WORKER", "main"))

@pytest.mark.ordering
def test_verdict(sharedkv_results):
    sharedkv_results.note("ordering", "raw: NOT stream-ordered", level="verdict")

@pytest.mark.packed_page
def test_fails():
    assert False, "boom"
"""


@pytest.mark.parametrize("workers", [None, "2"])
def test_json_report_on_controller_only(pytester: pytest.Pytester, workers: str | None) -> None:
    pytester.makepyfile(RECORDING)
    args = ["--sharedkv-json=out/report.json", "-p", "no:cacheprovider"]
    if workers:
        args += ["-n", workers]
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=5, failed=1)
    data = json.loads((pytester.path / "out" / "report.json").read_text())
    assert data["schema"] == "pytest-sharedkv/1"
    assert data["summary"]["passed"] == 5 and data["summary"]["failed"] == 1
    assert len(data["tests"]) == 6
    assert len(data["checks"]) == 4
    assert {t["tier"] for t in data["tests"]} == {"ordering", "packed_page"}
    failed = next(t for t in data["tests"] if t["outcome"] == "failed")
    assert "boom" in failed["message"]
    # each test's parameters by name, across xdist too: compare matches tests by them
    params = {t["nodeid"].split("::")[1]: t["params"] for t in data["tests"]}
    assert params["test_cell[4KiB-1e8]"] == {"size": "4KiB", "delay": "1e8"}
    assert params["test_verdict"] == {} and params["test_fails"] == {}
    workers_seen = {f["value"] for f in data["facts"] if f["name"] == "worker"}
    if workers:
        # every worker's records made it into the one report the controller wrote
        assert workers_seen == {"gw0", "gw1"}
        assert {t["worker"] for t in data["tests"]} == {"gw0", "gw1"}
    else:
        assert workers_seen == {"main"}
    # no stray reports written by workers next to it
    assert sorted(p.name for p in (pytester.path / "out").iterdir()) == ["report.json"]
    result.stdout.fnmatch_lines([
        "*sharedkv summary*",
        "[[]ordering[]] tests: 5 passed",
        "| target | role             | direction | size | delay=0 | delay=1e8 |",
        "| raw    | negative-control | D2H       | 4KiB | 10/10   | 3/10      |",
        "*VERDICT: raw: NOT stream-ordered",
        "[[]packed_page[]] tests: 1 failed",
        "JSON report: */out/report.json",
    ])


def test_check_table_pivots_and_sums() -> None:
    checks = [
        Check("t", {"m": "a", "d": "0"}, 1, 2),
        Check("t", {"m": "a", "d": "0"}, 2, 2),
        Check("t", {"m": "a", "d": "9"}, 0, 4),
        Check("t", {"m": "b", "d": "9"}, 4, 4),
    ]
    lines = check_table(checks, TableSpec(rows=("m",), column="d", column_label="d="))
    assert lines == [
        "| m | d=0 | d=9 |",
        "|---|-----|-----|",
        "| a | 3/4 | 0/4 |",
        "| b | -   | 4/4 |",
    ]


def test_check_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match=r"passed=3 must lie in 0\.\.trials=2"):
        Check("t", {}, 3, 2)


def test_bundle_round_trip() -> None:
    bundle = Bundle(checks=[Check("t", {"k": "v"}, 1, 1, detail={"offset": 3})])
    assert Bundle.from_data(json.loads(json.dumps(bundle.to_data()))) == bundle


def test_unwritable_report_falls_back(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    line = write_or_fallback(blocker / "report.json", {"x": 1})
    assert line.startswith("--sharedkv-json: could not write")
    fallback = Path(line.rsplit(" ", 1)[1])
    assert json.loads(fallback.read_text()) == {"x": 1}
    fallback.unlink()


def test_no_summary_without_sharedkv_tests(pytester: pytest.Pytester,
                                           fake_gpus: Callable[[str], None]) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert "sharedkv summary" not in result.stdout.str()


def test_replica_verdicts_join_bytes_and_answers() -> None:
    from pytest_sharedkv.replica_pair.summary import summary_lines
    from pytest_sharedkv.report.run_log import RunLog
    def cell(provider: str, allocator: str, delay: str, passed: int, trials: int,
             message: str = "", status: str = "") -> Check:
        return Check("replica_pair", {"provider": provider, "allocator": allocator,
                                      "delay": delay}, passed, trials, message=message,
                     kind="bytes", status=status)

    log = RunLog()
    log.bundle.checks.extend([
        cell("transfer (cuda)", "lazy", "0", 256, 256),
        cell("transfer (cuda)", "lazy", "1e8", 32, 256, "wrong bytes: 224 of 256"),
        cell("transfer (cuda)", "mixed", "0", 256, 256),
        cell("transfer (cuda)", "mixed", "1e8", 256, 256),
        cell("vllm", "lazy", "1e8", 3, 3),
        cell("transfer (cpu)", "mixed", "0", 256, 256),
    ])
    lines = summary_lines(log)
    assert lines[0].startswith("VERDICT lazy: NOT stream-ordered: under a 1e8-cycle delay "
                               "224 of 256 KV pages B retrieved hold wrong bytes (256/256 "
                               "right undelayed); suggestion (not proven by this run)")
    assert lines[1].startswith("NOTE lazy: the served model's answers stayed exact (3/3)")
    assert lines[2] == ("VERDICT mixed: stream-ordered (256/256 KV pages right under a "
                        "1e8-cycle delay, 256/256 undelayed)")
    assert len(lines) == 3
    # the status says VOID, whatever the message says
    log.bundle.checks[1] = cell("transfer (cuda)", "lazy", "1e8", 0, 256, "never ran", "void")
    assert summary_lines(log)[0] == ("VERDICT lazy: VOID at delay 1e8 (the server never ran "
                                     "the delay)")
    assert summary_lines(RunLog()) == []


def test_a_killed_run_leaves_a_partial_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
import os, signal
import pytest

@pytest.mark.ordering
def test_first_fails():
    assert False, "found before the kill"

@pytest.mark.ordering
def test_then_killed():
    os.kill(os.getpid(), signal.SIGKILL)
""")
    result = pytester.runpytest_subprocess("--sharedkv-json=report.json", "-p", "no:xdist",
                                           "-p", "no:cacheprovider")
    assert result.ret != 0
    data = json.loads((pytester.path / "report.json").read_text())
    assert data["complete"] is False and data["exitstatus"] is None
    failed = [t for t in data["tests"] if t["outcome"] == "failed"]
    assert len(failed) == 1 and "found before the kill" in failed[0]["message"]


def test_a_pipe_inside_a_cell_keeps_the_table() -> None:
    from pytest_sharedkv.report.markdown import markdown_table
    lines = markdown_table(["layout", "path"], [["a|b", "x"], ["c", "y\\|z"]])
    # every row has exactly the header's cell separators once pipes in cells are escaped
    separators = [line.replace("\\|", "").count("|") for line in lines]
    assert separators == [3, 3, 3, 3]
    assert lines[2].startswith("| a\\|b ")


def _log(outcomes: dict[str, str], void: tuple[str, ...] = ()) -> RunLog:
    log = RunLog()
    for nodeid, outcome in outcomes.items():
        log.tests[nodeid] = Result(nodeid, "replica_pair", outcome=outcome,
                                       categories=[outcome])
    for nodeid in void:  # a record that says its result proves nothing, whatever its text
        log.bundle.checks.append(Check("replica_pair", {"k": nodeid}, 0, 1, nodeid=nodeid,
                                       message="delay never ran", status="void"))
    return log


def test_one_verdict_line_ends_the_summary() -> None:
    from pytest_sharedkv.report.terminal import summary_lines

    passing = _log({"a": "passed", "b": "skipped", "c": "xfailed"})
    assert summary_lines(passing)[-1] == "sharedkv: PASS \N{EM DASH} 1 passed, 1 skipped, 1 xfailed"
    failing = _log({"a": "passed", "b": "failed"})
    assert summary_lines(failing)[-1].startswith("sharedkv: FAIL \N{EM DASH} 1 passed, 1 failed")
    # a failure whose own record is VOID proves nothing; another failure still fails
    assert summary_lines(_log({"a": "passed", "b": "failed"}, void=("b",)))[-1].startswith(
        "sharedkv: VOID \N{EM DASH} 1 passed, 1 failed; 1 test recorded a result that proves")
    assert summary_lines(_log({"a": "failed", "b": "failed"}, void=("b",)))[-1].startswith(
        "sharedkv: FAIL")
    voided_text = _log({"a": "passed"})
    voided_text.bundle.checks.append(Check("replica_pair", {}, 1, 1, message="VOID: text"))
    assert summary_lines(voided_text)[-1].startswith("sharedkv: PASS")
    # a tier's own word in its detail is evidence, not a status: only ``status`` voids
    voided_detail = _log({"a": "passed"})
    voided_detail.bundle.checks.append(Check("service_regression", {}, 1, 1, nodeid="a",
                                             detail={"status": "VOID"}))
    assert summary_lines(voided_detail)[-1].startswith("sharedkv: PASS")
    stopped = _log({"a": "passed"})
    stopped.tests["b"] = Result("b", "replica_pair")
    stopped.interrupted = "KeyboardInterrupt: SIGTERM"
    assert summary_lines(stopped)[-1] == (
        "sharedkv: INCOMPLETE \N{EM DASH} 1 passed; 1 test without an outcome "
        "(KeyboardInterrupt: SIGTERM)")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _committed_records() -> list[tuple[str, dict[str, Any]]]:
    """(list name, record) of every record with a kind in the committed reports."""
    out = []
    for path in sorted(FIXTURES.rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == "pytest-sharedkv/1":
            out += [(name, r) for name in ("checks", "notes") for r in data[name] if "kind" in r]
    return out


def test_records_read_and_written_keep_the_committed_json_byte_for_byte() -> None:
    """Kinds, statuses and roles are words (enums) inside; what the reports hold, and what
    crosses xdist, is their text, unchanged."""
    records = _committed_records()
    assert len(records) > 500
    for name, record in records:
        made = (Check(**record) if name == "checks" else Note(**record)).to_data()
        assert json.dumps(made) == json.dumps(record)
        assert all(type(v) is str for k, v in made.items() if k in ("kind", "status", "role"))
    check = Check("t", {}, 1, 2, kind="leak")
    assert (check.kind, check.status, check.role) == (Kind.LEAK, Status.FAIL, Role.CHECK)
    assert check.kind == "leak" and f"{check.status}" == "fail" and str(check.role) == "check"
    data = Bundle(checks=[check], notes=[Note("t", "x", status=Status.VOID)]).to_data()
    assert [type(data[n][0][k]) for n in ("checks", "notes") for k in ("kind", "status")] == \
        [str] * 4


@pytest.mark.parametrize(("field", "value"), [("kind", "lek"), ("status", "VOID"),
                                              ("role", "control-ish")])
def test_a_word_a_record_does_not_know_is_refused_naming_the_words(field: str,
                                                                   value: str) -> None:
    words = {"kind": KINDS, "status": STATUSES, "role": ROLES}[field]
    given: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=rf"^{field} must be one of {re.escape(str(words))}"):
        Check("t", {}, 1, 1, **given)


def test_spooled_records_are_merged_once_and_only_where_no_report_brought_them(
        ) -> None:
    """A worker's spool (report/spool.py): each record written once however often it is
    flushed; the controller keeps those no report named, once however often it merges, and
    a test it knows only from them has no outcome; a line cut short by a kill is skipped."""
    spool = Spool("1-run", "gw0")
    bundle = Bundle()
    first = Check("t", {"cell": "a"}, 1, 1, nodeid="x.py::test_a")
    bundle.checks.append(first)
    spool.write("x.py::test_a", "ordering", bundle)
    spool.write("x.py::test_a", "ordering", bundle)  # flushed again: nothing new
    reported = spool.reported()  # the test's report carries it
    assert len(reported) == 1
    bundle = Bundle(checks=[Check("t", {"cell": "b"}, 0, 1, nodeid="x.py::test_b")],
                    notes=[Note("t", "said", nodeid="x.py::test_b")])
    spool.write("x.py::test_b", "ordering", bundle, interrupted=True)
    spool.reported()
    where = directory("1-run")
    with next(where.glob("*.jsonl")).open("a") as out:
        out.write('{"id": "cut", "sec')
    log = RunLog(received=set(reported))
    assert merge(log, where) == 2
    assert merge(log, where) == 0
    assert [(c.key, c.status) for c in log.bundle.checks] == [({"cell": "b"}, Status.FAIL)]
    assert [n.text for n in log.bundle.notes] == ["said"]
    assert log.tests["x.py::test_b"].outcome is None
    assert log.tests["x.py::test_b"].worker == "gw0"
    assert "x.py::test_a" not in log.tests
