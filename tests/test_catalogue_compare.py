"""``compare`` carries the fault catalogue: a class BEFORE's checks saw and AFTER's do not
(missed or VOID) is a correctness difference named per class ("the suite's sight
changed"); a class only AFTER ran is said, not judged; detections that moved between checks
are said. Read from kind, status and detections, never the message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main

ROOT = Path(__file__).resolve().parents[1]
SCREENING = ROOT / "fixtures" / "perf" / "screening.json"
NODE = "suites/test_service_regression.py::test_fault_catalogue[mixed]"
PAIR = {"provider": "vllm", "allocator": "mixed", "delay": "0"}


def cell(name: str, status: str, caught: tuple[str, ...] = ("audit",),
         expected: tuple[str, ...] = ("audit",), message: str = "") -> dict[str, Any]:
    return {"tier": "service_regression", "key": {**PAIR, "size": "catalogue", "step": name},
            "passed": 8, "trials": 8, "role": "check", "message": message, "nodeid": NODE,
            "kind": "fault-catalogue", "status": status,
            "detail": {"expected": list(expected), "caught_by": list(caught),
                       "race_probe": name == "delayed-producer"}}


def _report(tmp_path: Path, name: str, checks: list[dict[str, Any]]) -> Path:
    data: dict[str, Any] = json.loads(SCREENING.read_text())
    data["checks"] += checks
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _compare(capsys: pytest.CaptureFixture[str], tmp_path: Path, before: list[dict[str, Any]],
             after: list[dict[str, Any]]) -> tuple[int, str, list[list[str]]]:
    status = main([str(_report(tmp_path, "b.json", before)),
                   str(_report(tmp_path, "a.json", after))])
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in out.split("## Correctness (AFTER)")[1].split("## Performance")[0]
            .splitlines() if line.startswith("| NEW") or line.startswith("| also")]
    return status, out, rows


@pytest.mark.parametrize(("now", "words"), [
    (cell("misrouted", "fail", caught=()), "missed in AFTER (caught by nothing)"),
    (cell("misrouted", "void", caught=()), "VOID in AFTER (the fault was never applied)"),
    (cell("misrouted", "unknown", caught=()), "unknown in AFTER (its cell could not be judged)"),
])
def test_a_class_before_saw_and_after_does_not_is_named(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, now: dict[str, Any],
        words: str) -> None:
    status, out, rows = _compare(capsys, tmp_path, [cell("misrouted", "pass")], [now])
    assert status == 1
    assert ["NEW", "sight lost", "fault catalogue misrouted [provider=vllm, allocator=mixed, "
            "delay=0]", f"the suite's sight changed: BEFORE caught it by audit, {words}"
            ] in rows
    assert ("FAULT CATALOGUE: BEFORE saw 1 of 1 classes as expected, AFTER 0 of 1; the "
            "suite's sight changed: 1 class(es) no longer seen") in out


def test_the_same_sight_is_no_difference_and_new_classes_are_said_not_judged(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # the control and the race probe (no race either side) are no sight of a fault class
    quiet = [cell("bit-flip-unread", "pass", caught=(), expected=()),
             cell("delayed-producer", "pass", caught=(), expected=("answers", "audit"))]
    before = [cell("misrouted", "pass"), cell("lost-write", "pass", caught=("answers",)),
              *quiet]
    after = [cell("misrouted", "pass", message="this suite cannot see misrouted (reworded)"),
             cell("lost-write", "pass", caught=("audit",)), *quiet,
             cell("state-foreign", "fail", caught=())]
    status, out, rows = _compare(capsys, tmp_path, before, after)
    assert status == 0 and rows == []
    assert "FAULT CATALOGUE: BEFORE saw 2 of 4 classes as expected, AFTER 2 of 5" in out
    assert "  new in AFTER (said, not judged): state-foreign" in out
    assert "  caught by other checks: lost-write (BEFORE by answers, AFTER by audit)" in out


def test_a_class_after_did_not_run_is_said(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    status, out, rows = _compare(capsys, tmp_path, [cell("misrouted", "pass"),
                                                    cell("bit-flip", "pass")],
                                 [cell("misrouted", "pass")])
    assert status == 0 and rows == []
    assert "  not run in AFTER: bit-flip" in out


def test_a_void_catalogue_cell_voids_itself_not_its_tier(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """BEFORE's divergence stays a baseline: a VOID catalogue cell beside it does not make
    the whole tier "proved nothing" (AFTER's same divergence is old, not new)."""
    divergence = {"tier": "service_regression", "key": {**PAIR, "size": "3k", "step": "chain"},
                  "passed": 0, "trials": 1, "role": "check", "message": "3k-001 diverged",
                  "detail": {"case": "3k-001"}, "nodeid": "x::test_request_chain[mixed-3k-001]",
                  "kind": "divergence", "status": "fail"}
    void = cell("lost-write", "void", caught=())
    _, out, rows = _compare(capsys, tmp_path, [divergence, void], [divergence, void])
    assert [r[:2] for r in rows] == [["also in BEFORE", "divergence"],
                                     ["also in BEFORE", "VOID"]]
    assert "BEFORE VOID in" not in out
