"""The service triage (``--sharedkv-triage``) and the remedies a run may call proven.

The classifier is held to every class by the cell outcomes that must produce it, and each
outcome flipped must change it (the checker can fail). End to end on the stub: a fault
the replicas' CUDA_LAUNCH_BLOCKING=1 removes is named a stream-ordering race, one no
control removes is named by what persisted, and controls a stub pair cannot act on (no
server, no allocator) are "n/a", not a verdict. A remedy is proven only by a triage cell,
the other allocator's exact pair or a ``--sharedkv-baseline`` report; else a suggestion.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.config.options import MEASURED_ENV
from pytest_sharedkv.corpus.cases import Case, CaseSet
from pytest_sharedkv.report.records import Bundle, Check
from pytest_sharedkv.service import summary
from pytest_sharedkv.service.answers import Answer, ServiceRun
from pytest_sharedkv.service.baseline import Baseline, BaselinePair, read_baseline, remedies
from pytest_sharedkv.service.triage import Base, Cell, classify, controls_for, cross_line
from tests.launch_faults import StubFaults, plant

BASE = ["--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-triage", "--sharedkv-kv-audit",
        "-k", "triage"]
H200 = Path(__file__).parent.parent / "fixtures" / "lmcache" / "h200"


def _cells(outcomes: Mapping[str, bool | None]) -> list[Cell]:
    """A cell per control: True removed (4/4 exact, clean audit), False persisted, None n/a."""
    cells = []
    for control in controls_for("lazy"):
        outcome = outcomes.get(control.name, False)
        cell = Cell(control, requests=4, exact=4 if outcome else 0,
                    mismatches=0 if outcome else 12, compared=100)
        if outcome is None:
            cell = Cell(control, not_applicable="not here")
        cells.append(cell)
    return cells


LAZY = Base("lazy", "3k", 200, 24, 10_889)
CASES: list[tuple[dict[str, bool | None], str, str]] = [
    ({"launch-blocking-server": True, "launch-blocking-all": True, "sync-transfers": True},
     "ordering", "stream-ordering race (removed by"),
    ({"launch-blocking-all": True, "one-in-flight": True}, "ordering-concurrency",
     "between concurrent operations"),
    ({"one-in-flight": True}, "concurrency", "interaction between concurrent operations"),
    ({"other-allocator": True}, "not-ordering",
     "not an ordering fault (persists with CUDA_LAUNCH_BLOCKING=1"),
    ({"other-allocator": True, "launch-blocking-all": None}, "allocator",
     "removed only by the mixed allocator"),
    ({}, "not-ordering", "not an ordering fault"),
    ({"launch-blocking-all": None}, "persists", "not removed by any control"),
]


@pytest.mark.parametrize(("outcomes", "klass", "text"), CASES,
                         ids=[c[1] + "-" + "-".join(c[0]) for c in CASES])
def test_each_class_comes_from_the_controls_that_removed_the_fault(
        outcomes: dict[str, bool | None], klass: str, text: str) -> None:
    verdict = classify(LAZY, _cells(outcomes))
    assert verdict.klass == klass
    assert text in verdict.text
    assert verdict.line(LAZY).startswith(f"TRIAGE lazy: {verdict.text} (the pass: 24 of 200")


def test_a_cell_that_could_not_run_decides_nothing() -> None:
    cells = _cells({"launch-blocking-all": None})
    cells[0] = Cell(cells[0].control, why_unknown="its pair did not start: boom")
    verdict = classify(LAZY, cells)
    assert verdict.klass == "undecided" and "one-in-flight: its pair did not start" in \
        verdict.text


def test_flipping_any_decisive_cell_changes_the_class() -> None:
    """A mutation test of the classifier: each decisive outcome, flipped, moves the class."""
    ordering = {"launch-blocking-server": True, "launch-blocking-all": True}
    assert classify(LAZY, _cells(ordering)).klass == "ordering"
    assert classify(LAZY, _cells({**ordering, "launch-blocking-all": False})).klass == \
        "not-ordering"
    assert classify(LAZY, _cells({**ordering, "one-in-flight": True})).klass == \
        "ordering-concurrency"
    assert classify(LAZY, _cells({"launch-blocking-all": False, "other-allocator": False}
                                 )).klass == "not-ordering"


def test_proven_remedies_are_the_removing_cells_with_a_deployable_change() -> None:
    verdict = classify(LAZY, _cells({"launch-blocking-server": True, "other-allocator": True,
                                     "sync-transfers": True, "launch-blocking-all": True}))
    assert [p.split(" (")[0] for p in verdict.proven] == [
        "set CUDA_LAUNCH_BLOCKING=1 in the LMCache server's environment",
        "start the LMCache server with --no-l1-use-lazy"]
    assert not classify(LAZY, _cells({})).proven  # nothing removed: nothing proven
    cells = _cells({"other-allocator": True, "launch-blocking-all": None})
    cells[-1].mismatches = None  # its audit compared nothing: the line says so, not "0"
    [line] = classify(LAZY, cells).proven
    assert line.endswith("4/4 exact, the audit compared nothing (answers only))")


def _step(allocator: str, step: str, passed: int, status: str, size: str = "3k") -> Check:
    return Check("service_regression", {"provider": "vllm", "allocator": allocator,
                                        "delay": "0", "size": size, "step": step},
                 passed, 200 if size != "gate" else 8, kind="gate" if size == "gate"
                 else "divergence", status=status)


def test_the_remedy_is_a_suggestion_unless_a_run_proved_it() -> None:
    lazy = [_step("lazy", "cross", 176, "fail")]
    assert summary.remedy_line(lazy, "lazy").startswith("suggestion (not proven by this run")
    mixed = [_step("mixed", "zeroed chunk", 8, "pass", "gate"),
             _step("mixed", "cross", 200, "pass")]
    line = summary.remedy_line(lazy + mixed, "lazy")
    assert line.startswith("remedy: start the LMCache server with --no-l1-use-lazy (proven in "
                           "this run: the mixed pair answered 200/200")
    # an unproven gate proves nothing: the mixed pair's exact answers do not count
    unproven = [_step("mixed", "zeroed chunk", 0, "void", "gate"), mixed[1]]
    assert summary.remedy_line(lazy + unproven, "lazy").startswith("suggestion")


def test_a_removing_cell_without_a_deployable_change_is_said_as_a_suggestion() -> None:
    """sync-transfers removed the fault: what it suggests (a code change) is printed, as
    untested, beside the proven remedies; alone it is the whole line, never a remedy."""
    def cell(step: str, remedy: str, suggestion: str) -> Check:
        return Check("service_regression", {"provider": "vllm", "allocator": "lazy",
                                            "delay": "0", "size": "triage", "step": step},
                     200, 200, kind="triage", status="pass",
                     detail={"remedy": remedy, "suggestion": suggestion, "mismatches": 0})
    lazy = [_step("lazy", "cross", 176, "fail")]
    sync = cell("sync-transfers", "", "make LMCache's KV transfers wait")
    server = cell("launch-blocking-server", "set CUDA_LAUNCH_BLOCKING=1", "")
    assert summary.remedy_line([*lazy, sync], "lazy") == (
        "suggestion (not a proven remedy): make LMCache's KV transfers wait (the triage cell "
        "sync-transfers removed the fault; as a remedy untested)")
    line = summary.remedy_line([*lazy, sync, server], "lazy")
    assert line.startswith("remedy: set CUDA_LAUNCH_BLOCKING=1 (proven by the triage cell "
                           "launch-blocking-server: 200/200 exact, 0 mismatching digests)")
    assert line.endswith("; suggestion (not a proven remedy): make LMCache's KV transfers "
                         "wait (the triage cell sync-transfers removed the fault; as a remedy "
                         "untested)")


def test_a_compiled_baseline_proves_the_compiled_kernels_for_a_fallback_run() -> None:
    base = Baseline("b.json", "0.5.6", "compiled", "lmcache.cuda_ops",
                    (BaselinePair("lazy", 200, 200, True),))
    assert remedies(base, "lazy", "torch-fallback")[0].startswith(
        "run LMCache's compiled kernels, a build that loads against this torch (proven by "
        "the baseline b.json: LMCache 0.5.6 on compiled (lmcache.cuda_ops): the lazy pair "
        "answered 200/200")
    assert remedies(base, "lazy", "compiled") == []  # same path: it proves nothing new
    wrong = Baseline("b.json", "0.5.6", "compiled", None, (BaselinePair("lazy", 199, 200, True),))
    assert remedies(wrong, "lazy", "torch-fallback") == []


def test_an_older_report_reads_as_a_baseline_without_a_kernel_path() -> None:
    baseline = read_baseline(H200 / "service-0.5.6-compiled.json")
    assert {p.allocator: (p.cross_exact, p.cross_total, p.exact) for p in baseline.pairs} == {
        "lazy": (200, 200, True), "mixed": (200, 200, True)}
    assert baseline.kernel_path.startswith("unknown")  # so it proves no kernel remedy
    assert remedies(baseline, "lazy", "torch-fallback") == []


@pytest.mark.parametrize(("content", "why"), [
    (None, "no such file"), ("{not json", "not valid JSON"),
    ('{"schema": "other/1"}', "not a sharedkv JSON report"),
    ('{"schema": "pytest-sharedkv/1", "checks": []}', "holds no service_regression pair")])
def test_a_bad_baseline_is_a_usage_error_naming_the_option_and_file(
        pytester: pytest.Pytester, content: str | None, why: str) -> None:
    if content is not None:
        pytester.path.joinpath("b.json").write_text(content)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--sharedkv-baseline=b.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--sharedkv-baseline: {pytester.path}/b.json: {why}*"])
    assert "Traceback" not in result.stderr.str()


def _triage_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fault: StubFaults
                ) -> tuple[pytest.RunResult, dict[str, Any], list[str]]:
    """The triage of a planted FAULT: the run, its cells by name, the triage's verdicts."""
    monkeypatch.setenv(MEASURED_ENV, "4")
    plant(pytester, fault)
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    report = json.loads((pytester.path / "r.json").read_text())
    cells = {c["key"]["step"]: c for c in report["checks"] if c["key"].get("size") == "triage"}
    # the class is said in the verdict note's words alone (no record field holds it)
    said = [n["text"] for n in report["notes"] if n["kind"] == "triage-verdict"]
    return result, cells, said


def test_a_fault_launch_blocking_hides_is_named_a_stream_ordering_race(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result, cells, said = _triage_run(
        pytester, monkeypatch, StubFaults(corrupt_external_unless="CUDA_LAUNCH_BLOCKING"))
    result.assert_outcomes(passed=1)
    assert {k: c["status"] for k, c in cells.items()} == {
        "one-in-flight": "fail", "launch-blocking-all": "pass",
        # the stub pair has no LMCache server and no allocator: nothing to change
        "launch-blocking-server": "info", "sync-transfers": "info", "other-allocator": "info",
        # the stub stands in for a torch-fallback server's hooks: its code remedies run
        "current-stream": "fail", "wait-producer": "fail"}
    assert cells["one-in-flight"]["detail"]["mismatches"] > 0  # the audit saw it too
    # the table's rows: the control that removed it, 4/4 exact, no mismatching digest; a
    # control the pair cannot act on ran nothing (n/a, no audit)
    both = cells["launch-blocking-all"]
    assert (both["detail"]["control"], both["detail"]["group"], both["passed"],
            both["trials"], both["detail"]["mismatches"], both["detail"]["removed"]) == (
        "CUDA_LAUNCH_BLOCKING=1 in the LMCache server and both replicas", "3k", 4, 4, 0, True)
    server = cells["launch-blocking-server"]
    assert (server["trials"], server["detail"]["mismatches"], server["detail"]["removed"]) == \
        (0, None, None)
    [line] = said
    assert fnmatch(line, (
        "TRIAGE n/a: stream-ordering race (removed by CUDA_LAUNCH_BLOCKING=1 in the LMCache "
        "server and both replicas); code remedies: current-stream left it (4 of 4 wrong, * "
        "mismatching digests of *); wait-producer left it (4 of 4 wrong, * (the pass: 4 of 4 "
        "3k cross-replica answers wrong*")), line


CUT_AFTER_TWO_CELLS = """
import pytest_sharedkv.service.triage as _triage

_run_cell, _cells = _triage.run_cell, []


def _cut(*args, **kwargs):
    if len(_cells) == 2:  # the run ends as a Ctrl-C or a SIGTERM would end it
        raise KeyboardInterrupt
    _cells.append(1)
    return _run_cell(*args, **kwargs)


_triage.run_cell = _cut
"""


def test_a_triage_cut_short_keeps_the_cells_it_finished_in_the_report(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200 triage stopped by its time limit after six cells had judged them all and
    written none (the records were written when the triage ended): each cell is now a record
    the moment it is judged, and a triage that never ended says no verdict."""
    monkeypatch.setenv(MEASURED_ENV, "4")
    plant(pytester, StubFaults(corrupt_external_unless="CUDA_LAUNCH_BLOCKING"))
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text() + CUT_AFTER_TWO_CELLS)
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    report = json.loads((pytester.path / "r.json").read_text())
    cells = {c["key"]["step"]: c["status"] for c in report["checks"]
             if c["key"].get("size") == "triage"}
    assert cells == {"one-in-flight": "fail", "launch-blocking-all": "pass"}
    assert [n for n in report["notes"] if n["kind"] == "triage-verdict"] == []


def test_a_fault_no_control_removes_is_not_called_a_race(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result, cells, said = _triage_run(pytester, monkeypatch, StubFaults(corrupt_external=True))
    result.assert_outcomes(passed=1)
    assert cells["launch-blocking-all"]["status"] == "fail"
    assert cells["launch-blocking-all"]["detail"]["wrong"] == 4
    [line] = said
    assert line.startswith("TRIAGE n/a: not an ordering fault (persists with "
                           "CUDA_LAUNCH_BLOCKING=1 in the server and replicas: 4 of 4 "
                           "wrong"), line


def test_a_pair_that_answered_right_has_nothing_to_triage(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEASURED_ENV, "2")
    result = pytester.runpytest_subprocess(*BASE, "--sharedkv-json=r.json")
    result.assert_outcomes(skipped=1)
    [test] = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert test["message"] == ("nothing to triage: stub x2 (test double) answered 2 of 2 "
                               "cross-replica requests, all 2 answers right")


def _run_with(answers: dict[tuple[str, str], Answer]) -> ServiceRun:
    cases = [Case(f"3k-00{i}", "measured", "3k", "w", "0" * 64, expected=(1, 2))
             for i in range(3)]
    run = ServiceRun(CaseSet("copy", 32, cases), "pair")
    run.answers.update(answers)
    return run


def test_nothing_to_triage_says_what_was_sent_and_answered() -> None:
    """Issue 36: endpoints that answered nothing are never said to have answered right."""
    refused = "replica B (http://127.0.0.1:10): request failed: Connection refused"
    none = _run_with({(f"3k-00{i}", "cross"): Answer(f"3k-00{i}", "cross", "B", error=refused)
                      for i in range(3)})
    assert cross_line(none, "external") == (
        f"external answered 0 of 3 cross-replica requests (3 failed, first: {refused})")
    some = _run_with({("3k-000", "cross"): Answer("3k-000", "cross", "B", ids=(1, 2)),
                      ("3k-001", "cross"): Answer("3k-001", "cross", "B", error=refused)})
    assert cross_line(some, "stub") == ("stub answered 1 of 2 cross-replica requests (1 "
                                        f"failed, first: {refused}), all 1 answers right")
    assert cross_line(_run_with({}), "stub") == "stub was sent no cross-replica request"


def test_external_endpoints_that_answer_nothing_are_said_to_answer_nothing(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed ports (issue 36): the triage's skip, the wall-time note and the verdict say
    what was sent and that nothing came back, never answers that were not received."""
    from pytest_sharedkv.processes.managed import free_port

    monkeypatch.setenv(MEASURED_ENV, "2")
    closed = ",".join(f"http://127.0.0.1:{free_port()}" for _ in range(2))
    # its own process: the text corpus builds an order of magnitude slower in this one
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_sharedkv.suites", "-m", "service_regression", "-p",
        "no:cacheprovider", f"--sharedkv-endpoints={closed}", "--sharedkv-settle-s=0.01",
        "--sharedkv-service-sizes=3k", "-k", "triage or steps_account",
        "--sharedkv-json=r.json")
    result.assert_outcomes(skipped=2)  # the steps' hits: UNKNOWN (no counter was read)
    report = json.loads((pytester.path / "r.json").read_text())
    [triage] = [t for t in report["tests"] if "test_triage" in t["nodeid"]]
    assert triage["message"].startswith(
        f"nothing to triage: external {closed.replace(',', ', ')} answered 0 of 2 "
        "cross-replica requests (2 failed, first: replica B "), triage
    cross = {c["key"]["size"]: c for c in report["checks"] if c["key"].get("step") == "cross"}
    assert {size: (c["passed"], c["trials"], c["detail"]["errors"])
            for size, c in cross.items()} == {"warm-up": (0, 4, 4), "3k": (0, 2, 2)}
    [wall] = [n["text"] for n in report["notes"] if n["text"].startswith("wall time external")]
    assert wall.endswith(" requests sent, none answered, settles included"), wall
    [line] = summary.verdicts(Bundle.from_data(report).checks)
    assert line == ("VERDICT external: none of 2 cross-replica requests got an answer "
                    "(errors): nothing was judged")
    # nowhere (prose only: any line of the run) an answer that was not received
    result.stdout.no_fnmatch_line("*answered every*")
    result.stdout.no_fnmatch_line("*answered wrong*")


def test_a_cell_relaunches_the_pass_launch_with_its_control_on_top(tmp_path: Path) -> None:
    """The typed changes a control makes: the pass's devices, allocator and environment
    (the lease's device order) stay; the control's variables go on top; no gate, no delay,
    the audit on, logs of its own."""
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    order = (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),)
    spec = LaunchSpec(tmp_path / "pass", allocator="lazy", devices=("0",), server_env=order,
                      replica_env=order, inject_delay_cycles=5)
    controls = {c.name: c for c in controls_for("lazy")}
    cell = controls["launch-blocking-server"].relaunch(tmp_path / "cell").apply(spec)
    assert cell.server_env == (*order, ("CUDA_LAUNCH_BLOCKING", "1"))
    assert cell.replica_env == order
    assert (cell.log_dir, cell.gate, cell.kv_audit, cell.inject_delay_cycles, cell.devices,
            cell.allocator, cell.sync_transfers) == (tmp_path / "cell", False, True, 0,
                                                     ("0",), "lazy", False)
    other = controls["other-allocator"].relaunch(tmp_path / "o").apply(spec)
    assert other.allocator == "mixed" and other.server_env == order
    assert controls["sync-transfers"].relaunch(tmp_path / "s").apply(spec).sync_transfers


def test_a_verdict_counts_requests_without_an_answer_apart_from_wrong_answers() -> None:
    def cross(passed: int, errors: int | None) -> Check:
        return Check("service_regression", {"provider": "external", "allocator": "unknown",
                                            "delay": "0", "size": "3k", "step": "cross"},
                     passed, 10, kind="divergence", status="fail",
                     detail={} if errors is None else {"errors": errors})

    assert summary.verdicts([cross(6, 4)]) == [
        "VERDICT external: 4 of 10 cross-replica requests got no answer (errors); the 6 "
        "answered were exact"]
    [line] = summary.verdicts([cross(5, 4)])
    assert line.startswith("VERDICT external: 1 of 10 requests answered wrong after ")
    assert line.endswith("; 4 got no answer")
    [older] = summary.verdicts([cross(5, None)])  # a report without the count: as before
    assert older.startswith("VERDICT external: 5 of 10 requests answered wrong")


def test_a_finished_triage_has_no_incomplete_line() -> None:
    """Where the run recorded the triage's verdict note, the summary shows it alone: the
    INCOMPLETE line is only for a triage with cells and no verdict."""
    from pytest_sharedkv.report.records import Check
    from pytest_sharedkv.service.summary import triage_unfinished

    cell = Check("service_regression", {"provider": "stub", "allocator": "lazy",
                                        "delay": "0", "size": "triage",
                                        "step": "one-in-flight"}, 20, 24, kind="triage",
                 status="fail", detail={"control": "one request in flight",
                                        "counts": "4 of 24 wrong"},
                 nodeid="suites/test_service_regression.py::test_triage[lazy]")
    assert triage_unfinished([cell], {cell.nodeid}) == []
    [line] = triage_unfinished([cell], set())
    assert line.startswith("TRIAGE lazy: INCOMPLETE (1 of 7 cells judged; not judged: "
                           "launch-blocking-all, "), line
    assert "persists under one request in flight (4 of 24 wrong)" in line
