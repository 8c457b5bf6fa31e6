"""A run that collected or ran no sharedkv test never replaces the report of one that did
(issue 52): "run, upgrade, run, compare BEFORE AFTER" keeps its BEFORE; a mistyped
subcommand of ``python -m pytest_sharedkv`` is a usage error, not a pytest run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ONE_TEST = """
import pytest

@pytest.mark.ordering
def test_cell(sharedkv_results):
    sharedkv_results.check("ordering", {"target": "raw"}, 1, 1)
"""
REPORT = "sharedkv-report.json"
ARGS = (f"--sharedkv-json={REPORT}", "-p", "no:cacheprovider")


def _tests(path: Path) -> list[str]:
    return [t["nodeid"] for t in json.loads(path.read_text())["tests"]]


@pytest.mark.parametrize("nothing", [("--co",), ("-m", "nosuchmarker")], ids=["co", "no-match"])
def test_a_run_of_no_test_writes_beside_the_report_of_a_run_that_did(
        pytester: pytest.Pytester, nothing: tuple[str, ...]) -> None:
    pytester.makepyfile(ONE_TEST)
    pytester.runpytest(*ARGS).assert_outcomes(passed=1)
    report = pytester.path / REPORT
    ran = report.read_text()
    result = pytester.runpytest(*ARGS, *nothing)
    assert report.read_text() == ran, "the report of the run that ran a test was replaced"
    beside = pytester.path / "sharedkv-report.no-tests.json"
    assert json.loads(beside.read_text())["tests"] == []
    result.stdout.fnmatch_lines([f"JSON report: {beside} (this run ran no sharedkv test; "
                                 f"{report}, a run that did, is kept)"])
    again = pytester.runpytest(*ARGS, *nothing)  # the beside file holds no run's tests
    again.stdout.fnmatch_lines([f"JSON report: {beside} *"])
    pytester.runpytest(*ARGS).assert_outcomes(passed=1)  # a run that ran one replaces it
    assert _tests(report) == ["test_a_run_of_no_test_writes_beside_the_report_of_a_run_that_did"
                              ".py::test_cell"]


def test_a_run_of_no_test_writes_its_report_where_none_of_a_run_is(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_TEST)
    pytester.runpytest(*ARGS, "--co")
    assert _tests(pytester.path / REPORT) == []
    assert not (pytester.path / "sharedkv-report.no-tests.json").exists()


def _wrapper(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_sharedkv", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("typo", ["comapre", "merge-screening", "make_model"])
def test_a_mistyped_subcommand_is_a_usage_error_naming_the_subcommands(
        tmp_path: Path, typo: str) -> None:
    (tmp_path / REPORT).write_text('{"schema": "pytest-sharedkv/1", "tests": [{}]}')
    out = _wrapper([typo, "a.json", "b.json"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"python -m pytest_sharedkv: {typo!r} is no subcommand (did "
                               "you mean ")
    assert "run, make-model, compare, merge-screenings, help" in lines[0]
    assert (tmp_path / REPORT).read_text().startswith('{"schema"')  # no run replaced it


def test_a_test_path_is_no_mistyped_subcommand(tmp_path: Path) -> None:
    """A path that exists (a file named like a subcommand too) runs pytest on it."""
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "test_a.py").write_text("def test_a():\n    pass\n")
    out = _wrapper(["compare/test_a.py::test_a", "-p", "no:sharedkv", "-q",
                    "-p", "no:cacheprovider"], tmp_path)
    assert "no subcommand" not in out.stderr
    out = _wrapper(["comapre"], tmp_path)
    assert out.returncode == 2
