"""The recorded H200 screenings (fixtures/perf/h200/) still read, and the analysis gives
the numbers their terminal printed on the GPU: a change to the statistics that moved a
recorded result would show here first (tests/test_lmcache_h200_reports.py renders each
screening's tables whole against its log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.perf.observations import PerfRun, from_json
from pytest_sharedkv.perf.statistics import analyse
from pytest_sharedkv.perf.tables import report_lines

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "h200"


def _run(name: str) -> PerfRun:
    return from_json(json.loads((H200 / f"{name}.json").read_text())["perf"])


@pytest.mark.parametrize(("name", "blocks", "cells"), [
    ("blocks2", ["OFF", "ON", "ON", "OFF"], {("8k", "OFF", "cross"): 0.515,
                                             ("8k", "ON", "cross"): 0.372,
                                             ("32k", "OFF", "cross"): 1.254,
                                             ("32k", "ON", "cross"): 1.189,
                                             ("32k", "ON", "local"): 0.373}),
    ("blocks1", ["OFF", "ON"], {("32k", "ON", "cross"): 1.046,
                                ("8k", "OFF", "local"): 0.324}),
])
def test_the_recorded_screening_analyses_as_printed(name: str, blocks: list[str],
                                                    cells: dict[tuple[str, str, str], float]
                                                    ) -> None:
    run = _run(name)
    assert run.blocks == blocks and run.engine["gpu"] == "NVIDIA H200, NVIDIA H200"
    analysis = analyse(run)
    assert analysis.pairing.ok
    for (size, arm, step), median in cells.items():
        cell = analysis.cell(size, arm, step)
        assert cell is not None and round(cell.median_ttft_s, 3) == median
    text = "\n".join(report_lines(analysis))
    assert "lie above the physical floor" in text
    assert "NOTE hits: no chunk size was recorded" in text  # these reports predate it


def test_no_interval_is_said_once_under_each_table_not_in_every_row() -> None:
    """Two block pairs give no interval: each ratio table marks its rows "-" and says why
    once below; a screening of three block pairs keeps its intervals in the rows."""
    lines = report_lines(analyse(_run("blocks2")))
    rows = [line for line in lines if line.startswith("| ") and "x |" in line]
    assert len(rows) == 8 + 6  # TTFT ratios (2 sizes x 4 steps), session ratios
    assert all("no interval" not in row and "| -        |" in row for row in rows)
    why = 'no interval ("-" above): 2 block pairs (an interval needs >= 3)'
    assert [line for line in lines if line.startswith("no interval")] == [why, why]
    screening = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "screening.json"
    three = report_lines(analyse(from_json(json.loads(screening.read_text())["perf"])))
    assert not [line for line in three if line.startswith("no interval")]
    assert sum("| 95% interval " in line for line in three) == 12 + 4


def test_the_real_compute_screening_analyses_as_printed() -> None:
    """The 27b-compute screening on one H200 (CUDA graphs, compiled LMCache): the cross
    medians the GPU printed, every ON cross-replica request a full pool hit, the engine
    flags that shaped them in the report, and the layout floor's column once the stored
    bytes are known (the report predates the field)."""
    from dataclasses import replace

    from pytest_sharedkv.perf.tables import floor_table

    run = _run("perf-27b-compiled-s1")
    assert run.blocks == ["OFF", "ON"] and run.model["kind"] == "27b-compute"
    assert run.engine_settings["enforce_eager"] is False
    assert run.engine_settings["kv_cache_bytes"] == 35 << 30
    argv = run.launches[1]["processes"][1]["argv"]
    assert "--enforce-eager" not in argv and "--quantization" in argv
    analysis = analyse(run)
    expected = {("128k", "OFF", "cross"): 13.922, ("128k", "ON", "cross"): 0.801,
                ("32k", "ON", "cross"): 0.210, ("8k", "ON", "cross"): 0.073}
    for (size, arm, step), median in expected.items():
        cell = analysis.cell(size, arm, step)
        assert cell is not None and round(cell.median_ttft_s, 3) == median
    text = "\n".join(report_lines(analysis))
    assert "VERDICT hits: all 9 ON cross-replica requests were full pool hits" in text
    assert "layout floor" not in "\n".join(floor_table(analysis))
    assert run.floor is not None
    laid_out = analyse(replace(run, floor=replace(run.floor, stored_bytes_per_token=262_144)))
    row = next(r for r in floor_table(laid_out) if r.startswith("| 128k | ON"))
    assert "| 0.626 " in row and "| 1.28x " in row, row
