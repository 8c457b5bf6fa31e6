"""The perf plots: written next to the JSON report where matplotlib is installed (the
``plots`` extra), and without it no file and the one-line reason."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

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


H200 = SCREENING.parent / "h200" / "blocks2.json"


def _drawn(figure: Any) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas: Any = FigureCanvasAgg(figure)
    canvas.draw()
    return figure


def _shown_y_labels(ax: Any) -> list[str]:
    """The y tick labels with text that lie inside the axis' limits."""
    low, high = ax.get_ylim()
    return [t.get_text() for t, at in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
            if t.get_text() and low <= at <= high]


@pytest.mark.parametrize("path", [SCREENING, H200], ids=["seeded", "h200-blocks2"])
def test_the_log_axis_has_enough_labels_to_read_a_value(path: Path) -> None:
    """The H200 plot once labelled only 10^0 on an axis spanning 0.2-2 s."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    from pytest_sharedkv.perf.plots import ttft_figure

    figure = _drawn(ttft_figure(analyse(from_json(json.loads(path.read_text())["perf"]))))
    labels = _shown_y_labels(figure.axes[0])
    assert len(labels) >= 4, labels
    assert "1" in labels and "0.5" in labels, labels


def test_the_ttft_plot_draws_the_floor_per_size_and_arms_side_by_side(
        analysis: Analysis) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    from pytest_sharedkv.perf.plots import ttft_figure

    figure = ttft_figure(analysis)
    cross: Any = next(ax for ax in figure.axes if ax.get_title() == "cross")
    floor = analysis.run.floor
    assert floor is not None
    drawn = sorted(line.get_ydata()[0] for line in cross.get_lines())
    expected = sorted(floor.seconds(int(c.median_prompt_tokens)) for c in analysis.cells
                      if c.step == "cross" and c.arm == "ON")
    assert drawn == pytest.approx(expected)
    # each arm's medians at one x per size, the arms apart
    medians = [c.get_offsets()[:, 0] for c in cross.collections if c.get_sizes()[0] > 100]
    assert len(medians) == 2
    assert all(a < b for a, b in zip(*medians, strict=True))
    labels = figure.legends[0].get_texts()
    assert [t.get_text() for t in labels] == ["OFF (median; 3 block pairs)",
                                               "ON (median; 3 block pairs)",
                                               "transfer floor (KV at the measured H2D rate)"]


def test_the_titles_name_model_provider_and_engine(analysis: Analysis) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    from pytest_sharedkv.perf.plots import sessions_figure, ttft_figure

    real = analyse(from_json(json.loads(H200.read_text())["perf"]))
    for figure in (ttft_figure(real), sessions_figure(real)):
        text = figure.get_suptitle()
        assert "model edcd1fbe406e3f8b" in text and "provider vllm" in text, text
        assert "vllm 0.26.0" in text and "lmcache 0.5.6" in text, text
    stub = replace(analysis, run=replace(analysis.run, engine={
        "provider": "stub (test double)", "vllm": "0.26.0"}))
    text = ttft_figure(stub).get_suptitle()
    assert "TEST DOUBLE" in text and "vllm 0.26.0" not in text, text


def test_the_sessions_plot_has_a_legend(analysis: Analysis) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    from pytest_sharedkv.perf.plots import sessions_figure

    legend = sessions_figure(analysis).axes[0].get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == [
        "OFF: one session; 3 block pairs", "ON: one session; 3 block pairs",
        "one block pair's medians, joined"]


def test_arms_in_some_pairs_say_their_pairs_and_join_only_their_own(
        analysis: Analysis) -> None:
    """ON in two block pairs and NATIVE in one (a merge): each arm's legend entry says its
    pairs, and a pair's session line joins only the arms it ran (OFF-NATIVE for the last)."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    from pytest_sharedkv.perf.plots import sessions_figure, ttft_figure
    from tests.perf_arms import native_last

    mixed = analyse(native_last(analysis.run))
    labels = [t.get_text() for t in ttft_figure(mixed).legends[0].get_texts()]
    assert labels[:3] == ["OFF (median; 3 block pairs)", "ON (median; 2 block pairs)",
                          "NATIVE (median; 1 block pair)"]
    fixed: Any = sessions_figure(mixed).axes[0]
    assert sorted(list(line.get_xdata()) for line in fixed.get_lines()) == [
        [0, 1], [0, 1], [0, 2]]
