"""Replica placement: a screening with both replicas on one GPU against one with a replica
per GPU differs in placement, which ``compare`` says above the table (PLACEMENT DIFFERS)
instead of calling the other contention a regression, unless --allow-placement-change;
an unknown placement on either side is no difference. The perf tier records where the
replicas ran (``perf.replica_placement``); reports written before it say it through the
--sharedkv-pair-gpus setting.

BEFORE is the real one-GPU 27b-compute screening of two H200 sessions (s1 and s2 merged:
two block pairs, enough to judge); AFTER is its copy placed one replica per GPU, every
cold TTFT 30% slower."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main
from pytest_sharedkv.cli.merge import main as merge_main
from pytest_sharedkv.perf.blocks import placement_note
from pytest_sharedkv.perf.observations import (
    PerfReportError,
    PerfRun,
    ReplicaPlacement,
    from_json,
    placed_on,
    to_json,
)

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "h200"
S1, S2 = H200 / "perf-27b-compiled-s1.json", H200 / "perf-27b-compiled-s2.json"
LINE = ("PLACEMENT DIFFERS: BEFORE both replicas on one GPU, AFTER one replica per GPU: "
        "speed cells are shown but not judged as regressions")


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """s1 and s2 merged: the one-GPU screening of two block pairs (placement from the
    setting only: both predate perf.replica_placement)."""
    out = tmp_path_factory.mktemp("placement") / "one-gpu.json"
    assert merge_main([str(out), str(S1), str(S2)]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    assert "replica_placement" not in data["perf"]
    assert data["environment"]["settings"]["pair_gpus"] == "1"
    return data


def placed(data: dict[str, Any], gpus: int | None, setting: str | None = None,
           factor: float = 1.0) -> dict[str, Any]:
    """DATA as screened on GPUS (recorded; None: no placement recorded) with SETTING as
    its --sharedkv-pair-gpus (None: not recorded), every cold TTFT times FACTOR."""
    out = copy.deepcopy(data)
    if gpus is not None:
        devices = {"A": "0", "B": "0" if gpus == 1 else "1"}
        out["perf"]["replica_placement"] = {"pair_gpus": gpus, "replicas": devices}
    settings = out["environment"]["settings"]
    if setting is None:
        del settings["pair_gpus"]
    else:
        settings["pair_gpus"] = setting
    for o in out["perf"]["observations"]:
        if o["step"] == "cold":
            o["ttft_s"] *= factor
    return out


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, before: dict[str, Any],
        after: dict[str, Any], *args: str) -> tuple[int, str]:
    b, a = tmp_path / "before.json", tmp_path / "after.json"
    b.write_text(json.dumps(before))
    a.write_text(json.dumps(after))
    status = main([str(b), str(a), *args])
    return status, capsys.readouterr().out


def cold_rows(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("| ") and "| cold " in x]


@pytest.mark.parametrize("recorded", [False, True], ids=["setting", "recorded"])
def test_one_gpu_against_one_per_gpu_is_shown_not_judged(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, one_gpu: dict[str, Any],
        recorded: bool) -> None:
    """BEFORE's placement from its setting (the real reports) or recorded: the 30% slower
    cold cells (six REGRESSIONs on one placement) are shown, not judged: exit 0;
    --allow-placement-change judges them: exit 1."""
    before = placed(one_gpu, 1 if recorded else None, "1")
    after = placed(one_gpu, 2, "2", factor=1.3)
    status, out = run(capsys, tmp_path, before, after)
    assert status == 0, out
    assert "RESULT: OK" in out and "REGRESSION" not in out
    (line,) = [x for x in out.splitlines() if x.startswith("PLACEMENT DIFFERS: ")]
    assert line.startswith(LINE) and "--allow-placement-change judges them" in line
    assert out.index(line) < out.index("## Correctness")
    rows = cold_rows(out)
    assert len(rows) == 6 and all("slower +30.0%, not judged: PLACEMENT DIFFERS" in r
                                  for r in rows)
    status, out = run(capsys, tmp_path, before, after, "--allow-placement-change")
    assert status == 1
    assert "RESULT: FAIL: 6 significant regression(s) beyond 10%" in out
    assert "speed cells judged anyway (--allow-placement-change)" in out
    assert all(r.endswith("| REGRESSION |") for r in cold_rows(out))


@pytest.mark.parametrize("unknown", ["no setting", "stub", "external provider"])
def test_an_unknown_placement_is_no_difference(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, one_gpu: dict[str, Any],
        unknown: str) -> None:
    """A side whose placement is unknown (neither recorded nor set; a stub double, which
    records no GPU; an older external run, whose setting placed no engine) is not called
    a difference: speed is judged as usual, and the slower cells are regressions."""
    before = placed(one_gpu, None, "1")
    after = placed(one_gpu, 2, "2", factor=1.3)
    if unknown == "no setting":
        before = placed(one_gpu, None, None)
    elif unknown == "stub":
        after["perf"]["replica_placement"] = {"pair_gpus": None, "replicas": {}}
    else:
        after = placed(one_gpu, None, "2", factor=1.3)
        after["perf"]["engine"]["provider"] = "external"
    status, out = run(capsys, tmp_path, before, after)
    assert "PLACEMENT DIFFERS" not in out
    assert status == 1 and "6 significant regression(s)" in out


def test_the_same_placement_says_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                         one_gpu: dict[str, Any]) -> None:
    """One GPU recorded against one GPU set (another device): the same placement."""
    status, out = run(capsys, tmp_path, placed(one_gpu, None, "1"),
                      placed(one_gpu, 1, "1", factor=1.3))
    assert "PLACEMENT DIFFERS" not in out and status == 1


def test_flags_and_placement_that_differ_each_need_their_option(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, one_gpu: dict[str, Any]) -> None:
    """Both differ: a cell is not judged for both reasons, and one option alone judges
    nothing; both options judge the cells."""
    before = placed(one_gpu, 1, "1")
    after = placed(one_gpu, 2, "2", factor=1.3)
    after["perf"]["engine_settings"] = {**after["perf"]["engine_settings"], "max_num_seqs": 8}
    status, out = run(capsys, tmp_path, before, after)
    assert status == 0
    assert all("not judged: FLAGS DIFFER, PLACEMENT DIFFERS" in r for r in cold_rows(out))
    status, out = run(capsys, tmp_path, before, after, "--allow-flag-change")
    assert status == 0 and "REGRESSION" not in out
    assert ("--allow-flag-change given, but speed cells are still not judged: PLACEMENT "
            "DIFFERS") in out
    assert all("not judged: PLACEMENT DIFFERS |" in r for r in cold_rows(out))
    status, out = run(capsys, tmp_path, before, after, "--allow-placement-change")
    assert status == 0 and "REGRESSION" not in out
    assert all("not judged: FLAGS DIFFER |" in r for r in cold_rows(out))
    status, out = run(capsys, tmp_path, before, after, "--allow-flag-change",
                      "--allow-placement-change")
    assert status == 1 and "judged anyway (--allow-placement-change)" in out


def test_the_placement_of_launched_replicas_and_its_record() -> None:
    """One GPU each, both on one, both on the run's devices, nothing launched; the JSON
    record reads back, and a broken one is refused by name."""
    two = placed_on({"A": ("0",), "B": ("1",)})
    assert two == ReplicaPlacement(2, {"A": "0", "B": "1"})
    assert placement_note(two) == ("replica placement: one replica per GPU (A on CUDA "
                                    "device 0, B on CUDA device 1)")
    one = placed_on({"A": ("3",), "B": ("3",)})
    assert one.pair_gpus == 1
    assert placement_note(one) == ("replica placement: both replicas on one GPU (CUDA "
                                    "device 3)")
    inherited = placed_on({"A": (), "B": ()})  # the same environment: the same first GPU
    assert inherited == ReplicaPlacement(1, {"A": "", "B": ""})
    assert placement_note(placed_on({})).startswith("replica placement: no GPU known")
    run = PerfRun("pytest-sharedkv-perf/1", "m", "c", {}, [], None, replica_placement=two)
    data = to_json(run)
    assert data["replica_placement"] == {"pair_gpus": 2, "replicas": {"A": "0", "B": "1"}}
    assert from_json(data).replica_placement == two
    assert "replica_placement" not in to_json(PerfRun("pytest-sharedkv-perf/1", "m", "c",
                                                      {}, [], None))
    for bad, named in (({"pair_gpus": 0}, "perf.replica_placement.pair_gpus"),
                       ({"pair_gpus": "2"}, "perf.replica_placement.pair_gpus"),
                       ({"pair_gpus": 2, "replicas": ["0", "1"]},
                        "perf.replica_placement.replicas")):
        with pytest.raises(PerfReportError, match=named.replace(".", r"\.")):
            from_json({**data, "replica_placement": bad})
