"""The perf plots: written next to the JSON report where matplotlib is installed (the
``plots`` extra), and without it no file and the one-line reason."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_sharedkv.perf.observations import from_json
from pytest_sharedkv.perf.plots import MISSING, plot_paths, write_plots
from pytest_sharedkv.perf.statistics import Analysis, analyse

SCREENING = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "screening.json"


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    return analyse(from_json(json.loads(SCREENING.read_text())["perf"]))


def test_paths_sit_next_to_the_report() -> None:
    assert plot_paths(Path("/runs/sharedkv-report.json")) == (
        Path("/runs/sharedkv-report-perf-ttft.png"),
        Path("/runs/sharedkv-report-perf-sessions.png"))


def test_without_matplotlib_no_plot_and_the_reason(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path, analysis: Analysis) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    written, reason = write_plots(analysis, tmp_path / "report.json")
    assert written == [] and reason == MISSING
    assert list(tmp_path.iterdir()) == []


def test_the_plots_are_written(tmp_path: Path, analysis: Analysis) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    report = tmp_path / "run.json"
    written, reason = write_plots(analysis, report)
    assert reason is None
    assert written == list(plot_paths(report))
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = replace(analysis, cells=[], session_cells=[])
    assert write_plots(empty, tmp_path / "empty.json") == (
        [], "no plots: the run recorded no observations")
