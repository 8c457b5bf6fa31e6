"""``python -m pytest_sharedkv merge-screenings OUT IN1 IN2 ...``: the seeded screening
split in two and merged gives the statistics of the whole; inputs that did not measure
the same thing are refused naming the file and the field; ``compare`` reads a merged
report. The finer cases in-process, the exit codes through the real command line."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main as compare_main
from pytest_sharedkv.cli.compare.reading import read_report
from pytest_sharedkv.cli.merge import NOT_RECORDED, main, merge_runs
from pytest_sharedkv.perf.observations import from_json
from pytest_sharedkv.perf.statistics import Analysis, analyse

ROOT = Path(__file__).resolve().parents[1]
SCREENING = ROOT / "fixtures" / "perf" / "screening.json"
H200 = ROOT / "fixtures" / "perf" / "h200"


def load(path: Path = SCREENING) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def part(data: dict[str, Any], first: int, count: int) -> dict[str, Any]:
    """Blocks FIRST..FIRST+COUNT-1 of DATA's screening as a run of their own (numbered
    from 0, as the perf tier would have written them)."""
    out = copy.deepcopy(data)
    perf = out["perf"]
    pairs = first // 2
    perf["blocks"] = perf["blocks"][first:first + count]
    perf["restarts_s"] = perf["restarts_s"][first:first + count]
    for name in ("observations", "sessions"):
        perf[name] = [dict(o, block=o["block"] - first, pair=o["pair"] - pairs)
                      for o in perf[name] if first <= o["block"] < first + count]
    perf["wall_s"] = data["perf"]["wall_s"] * count / len(data["perf"]["blocks"])
    return out


def relabel(data: dict[str, Any], arm: str, to: str, factor: float = 1.0) -> dict[str, Any]:
    """DATA's blocks and records of ARM as arm TO (in place), cross-replica TTFTs times
    FACTOR: a run that screened another treatment on the same corpus."""
    perf = data["perf"]
    perf["blocks"] = [to if b == arm else b for b in perf["blocks"]]
    for name in ("observations", "sessions"):
        for o in perf[name]:
            if o["arm"] == arm:
                o["arm"] = to
                if o.get("step") == "cross":
                    o["ttft_s"] *= factor
    return data


def rerun(data: dict[str, Any], factor: float = 1.01) -> dict[str, Any]:
    """DATA as another run of the same screening (a copy, every TTFT times FACTOR): a copy
    with the same observations is the same run, which a merge refuses."""
    out = copy.deepcopy(data)
    for o in out["perf"]["observations"]:
        o["ttft_s"] *= factor
    return out


def write(directory: Path, name: str, data: dict[str, Any]) -> Path:
    path = directory / name
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def halves(tmp_path: Path) -> tuple[Path, Path]:
    whole = load()
    return (write(tmp_path, "first.json", part(whole, 0, 4)),
            write(tmp_path, "second.json", part(whole, 4, 2)))


def merged_analysis(path: Path) -> Analysis:
    return analyse(from_json(load(path)["perf"]))


def summary(analysis: Analysis) -> dict[str, Any]:
    return {
        "cells": [(c.size, c.arm, c.step, c.n, c.block_pairs, c.median_ttft_s,
                   c.per_pair_ttft_s) for c in analysis.cells],
        "ratios": [(r.size, r.step, r.arms, r.per_pair, r.requests, r.interval)
                   for r in analysis.ratios],
        "sessions": [(c.arm, c.placement, c.n, c.block_pairs, c.median_wall_s)
                     for c in analysis.session_cells],
        "session ratios": [(r.subject, r.ratio, r.per_pair, r.interval)
                           for r in analysis.session_ratios],
        "refusals": analysis.pairing.refusals,
    }


def test_the_halves_merged_give_the_statistics_of_the_whole(
        tmp_path: Path, halves: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged.json"
    assert main([str(out), *map(str, halves)]) == 0
    whole = analyse(from_json(load()["perf"]))
    merged = merged_analysis(out)
    assert merged.run.blocks == whole.run.blocks
    assert whole.run.block_pairs == [] and merged.run.block_pairs == [0, 0, 1, 1, 2, 2]
    assert merged.run.observations == whole.run.observations  # pairs numbered on
    assert merged.run.sessions == whole.run.sessions
    assert summary(merged) == summary(whole)
    assert all(r.interval is not None for r in merged.ratios)  # 3 pairs: an interval
    assert [(r.first_block, r.blocks, r.first_pair, r.pairs) for r in merged.run.runs] == \
        [(0, 4, 0, 2), (4, 2, 2, 1)]
    assert [r.source for r in merged.run.runs] == [str(p) for p in halves]
    first = merged.run.notes[0]
    assert first.startswith("merged from 2 separate runs: run 1: ")
    assert "blocks 4-5, block pairs 2-2" in first
    assert f"{NOT_RECORDED} in every run" in merged.run.notes[1]
    printed = capsys.readouterr().out
    assert "merged from 2 separate runs" in printed
    assert "VERDICT perf: cross-replica TTFT" in printed and "95% interval" in printed


def test_a_merged_report_merges_again(tmp_path: Path) -> None:
    """A screening resumed twice: the merged report of two runs merges with a third. (This
    test once merged the second run twice, which merge-screenings now refuses.)"""
    whole = load()
    thirds = [write(tmp_path, f"third{i}.json", part(whole, 2 * i, 2)) for i in range(3)]
    two = tmp_path / "two.json"
    assert main([str(two), *map(str, thirds[:2])]) == 0
    three = tmp_path / "three.json"
    assert main([str(three), str(two), str(thirds[2])]) == 0
    merged = merged_analysis(three)
    assert merged.pairing.ok
    assert [(r.source, r.first_block, r.first_pair) for r in merged.run.runs] == \
        [(str(thirds[0]), 0, 0), (str(thirds[1]), 2, 1), (str(thirds[2]), 4, 2)]
    assert {r.block_pairs for r in merged.ratios} == {3}
    assert summary(merged) == summary(analyse(from_json(whole["perf"])))
    assert merged.run.notes[0].startswith("merged from 3 separate runs: ")
    assert sum(n.startswith("merged from") for n in merged.run.notes) == 1


def test_pairing_stays_within_each_run(tmp_path: Path) -> None:
    """The second run's OFF block pairs with its own ON block, never with the first run's:
    a request the second run lacks in one arm is refused, not matched across runs."""
    whole = load()
    second = part(whole, 4, 2)
    dropped = next(o for o in second["perf"]["observations"]
                   if o["arm"] == "ON" and not o["warmup"])
    second["perf"]["observations"].remove(dropped)
    out = tmp_path / "merged.json"
    assert main([str(out), str(write(tmp_path, "a.json", part(whole, 0, 4))),
                 str(write(tmp_path, "b.json", second))]) == 0
    refusals = merged_analysis(out).pairing.refusals
    assert [(r.request, r.pair, r.arm) for r in refusals] == [
        (dropped["request"], 2, "OFF")]


def _change(field: str, data: dict[str, Any]) -> str:
    """Make DATA differ from the screening in FIELD; return what the refusal names."""
    perf = data["perf"]
    if field == "model_digest":
        perf["model_digest"] = "another-model"
        return "perf.model_digest"
    if field == "corpus_digest":
        perf["corpus_digest"] = "another-corpus"
        return "perf.corpus_digest"
    if field == "payload":
        o = next(o for o in perf["observations"] if not o["warmup"])
        o["payload_sha256"] = "0" * 64
        return "payload_sha256 (corpus, request"
    if field == "engine":
        perf["engine"]["vllm"] = "0.99.0"
        return "perf.engine.vllm"
    if field == "engine settings":
        perf["engine_settings"] = {"enforce_eager": True, "max_num_seqs": 16}
        return "perf.engine_settings (engine flags)"
    if field == "blocks and records":
        perf["blocks"] = ["ON", "OFF"]
        return "perf.observations[0].arm: 'OFF' in block 0, which perf.blocks runs as 'ON'"
    if field == "no OFF":
        relabel(data, "OFF", "NATIVE")
        return ("perf.blocks: block pair 0 (NATIVE-ON) holds no OFF block, the control its "
                "treatments are paired with")
    if field == "an arm twice":
        perf["blocks"], perf["block_pairs"] = ["OFF", "OFF"], [0, 0]
        return "perf.blocks: block pair 0 (OFF-OFF) is not a whole block pair"
    if field == "sizes":  # no size in common (fewer sizes merge: a host that dropped one)
        for o in perf["observations"]:
            o["size"] = "256k"
        return "perf.observations (sizes: none in common)"
    if field == "whole pairs":
        perf["blocks"] = ["OFF", "ON", "ON"]
        return "perf.blocks: 3 blocks (OFF-ON-ON) are not whole block pairs of 2"
    if field == "chunk":
        perf["chunk_tokens"] = 512
        return "perf.chunk_tokens"
    if field == "no perf":
        del data["perf"]
        return "perf: the report holds no perf screening"
    raise AssertionError(field)


REFUSALS = ["model_digest", "corpus_digest", "payload", "engine", "engine settings",
            "blocks and records", "no OFF", "an arm twice", "sizes", "whole pairs", "chunk",
            "no perf"]


@pytest.mark.parametrize("field", REFUSALS)
def test_a_merge_that_does_not_fit_is_refused_naming_file_and_field(
        tmp_path: Path, field: str, capsys: pytest.CaptureFixture[str]) -> None:
    whole = load()
    first = part(whole, 0, 4)
    if field == "engine settings":  # compared only where both runs recorded them
        first["perf"]["engine_settings"] = {"enforce_eager": False, "max_num_seqs": 16}
    second = part(whole, 4, 2)
    named = _change(field, second)
    a, b = write(tmp_path, "a.json", first), write(tmp_path, "b.json", second)
    out = tmp_path / "merged.json"
    assert main([str(out), str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m pytest_sharedkv merge-screenings: {b}: "), err
    assert named in err, err
    assert "Traceback" not in err
    assert not out.exists()


def three_on_one_native(tmp_path: Path) -> list[Path]:
    """Three OFF-ON runs written before block_pairs and one OFF-NATIVE run that records
    them (as the tier does now), its cross-replica TTFTs 3x ON's."""
    whole = load()
    native = relabel(part(whole, 4, 2), "ON", "NATIVE", factor=3.0)
    native["perf"]["block_pairs"] = [0, 0]
    runs = [part(whole, 0, 2), part(whole, 2, 2), part(whole, 4, 2), native]
    return [write(tmp_path, f"run{i}.json", d) for i, d in enumerate(runs)]


def test_runs_of_different_treatments_merge_and_pair_within_their_own_pairs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three OFF-ON sessions and one OFF-NATIVE session: the merged report records which
    blocks form each pair, ON/OFF has its three pairs and an interval, NATIVE/OFF its one
    pair and none; the notes say which run screened what."""
    out = tmp_path / "merged.json"
    assert main([str(out), *map(str, three_on_one_native(tmp_path))]) == 0
    merged = merged_analysis(out)
    assert merged.run.blocks == ["OFF", "ON", "ON", "OFF", "OFF", "ON", "OFF", "NATIVE"]
    assert merged.run.block_pairs == [0, 0, 1, 1, 2, 2, 3, 3]
    assert merged.pairing.ok, merged.pairing.refusals
    assert {(p.arms, p.pair) for p in merged.pairing.pairs} == {
        ("ON/OFF", 0), ("ON/OFF", 1), ("ON/OFF", 2), ("NATIVE/OFF", 3)}
    cross = {r.arms: r for r in merged.ratios if (r.size, r.step) == ("8k", "cross")}
    assert cross["ON/OFF"].block_pairs == 3 and cross["ON/OFF"].interval is not None
    assert cross["NATIVE/OFF"].block_pairs == 1 and cross["NATIVE/OFF"].interval is None
    assert cross["NATIVE/OFF"].median == pytest.approx(3 * cross["ON/OFF"].per_pair[2][1])
    assert [(r.first_block, r.first_pair, r.pairs) for r in merged.run.runs] == [
        (0, 0, 1), (2, 1, 1), (4, 2, 1), (6, 3, 1)]
    assert "block pairs 3-3, arms OFF-NATIVE" in merged.run.notes[0]
    assert merged.run.notes[1] == ("treatment arms differ between runs: ON in 3 block pairs, "
                                   "NATIVE in 1 block pair; each is paired with OFF of its own "
                                   "pairs")
    printed = capsys.readouterr().out
    assert "| 8k   | cross          | NATIVE/OFF |" in printed
    assert "ON: 3 block pairs, NATIVE: 1 block pair: no interval (an interval needs >= 3)" \
        in printed


def test_mixed_pair_sizes_merge_again_and_keep_their_pairs(tmp_path: Path) -> None:
    """An OFF-ON run merged with an OFF-ON-NATIVE run (three blocks a pair; both written
    before block_pairs), and that merge with an OFF-NATIVE run: every pair keeps its own
    blocks and numbers (the second run's pair is 1, not block 2 // 3 blocks a pair)."""
    whole = load()
    three = part(whole, 0, 2)
    on = [o for o in three["perf"]["observations"] if o["arm"] == "ON"]
    three["perf"]["blocks"].append("NATIVE")
    three["perf"]["observations"] += [dict(o, arm="NATIVE", block=2) for o in on]
    first = tmp_path / "first.json"
    assert main([str(first), str(write(tmp_path, "two.json", part(whole, 2, 2))),
                 str(write(tmp_path, "three.json", three))]) == 0
    native = relabel(part(whole, 4, 2), "ON", "NATIVE")
    out = tmp_path / "merged.json"
    assert main([str(out), str(first), str(write(tmp_path, "native.json", native))]) == 0
    merged = merged_analysis(out)
    assert merged.run.blocks == ["ON", "OFF", "OFF", "ON", "NATIVE", "OFF", "NATIVE"]
    assert merged.run.block_pairs == [0, 0, 1, 1, 1, 2, 2]
    assert merged.pairing.ok, merged.pairing.refusals
    assert sorted({(p.arms, p.pair) for p in merged.pairing.pairs}) == [
        ("NATIVE/OFF", 1), ("NATIVE/OFF", 2), ("ON/OFF", 0), ("ON/OFF", 1)]


def test_engine_flags_compare_where_recorded_launches_are_carried(tmp_path: Path) -> None:
    whole = load()
    first, second, third = part(whole, 0, 4), part(whole, 4, 2), rerun(part(whole, 4, 2))
    settings = {"enforce_eager": False, "max_num_seqs": 16}
    first["perf"]["engine_settings"] = second["perf"]["engine_settings"] = settings
    first["perf"]["launches"] = [{"arm": "OFF", "processes": [
        {"name": "A", "argv": ["vllm", "serve", "--port", "8001"], "env": {}}]}] * 4
    out = tmp_path / "merged.json"
    paths = [write(tmp_path, f"{i}.json", d) for i, d in enumerate((first, second, third))]
    assert main([str(out), *map(str, paths)]) == 0
    run = merged_analysis(out).run
    assert [r.engine_flags for r in run.runs] == ["recorded", "recorded", NOT_RECORDED]
    assert f"{NOT_RECORDED} in some runs" in run.notes[1]
    data = load(out)
    assert data["perf"]["engine_settings"] == settings  # carried from the first run


def test_the_h200_aa_pair_merges_into_three_block_pairs(tmp_path: Path) -> None:
    out = tmp_path / "merged.json"
    assert main([str(out), str(H200 / "blocks2.json"), str(H200 / "blocks1.json")]) == 0
    merged = merged_analysis(out)
    assert merged.pairing.ok
    assert {r.block_pairs for r in merged.ratios} == {3}
    assert all(r.interval is not None for r in merged.ratios)
    assert [r.created for r in merged.run.runs] == [
        load(H200 / "blocks2.json")["created"], load(H200 / "blocks1.json")["created"]]
    assert all("NVIDIA H200" in r.host for r in merged.run.runs)
    rates = [from_json(load(H200 / f)["perf"]).floor for f in ("blocks2.json", "blocks1.json")]
    assert merged.run.floor is not None
    assert merged.run.floor.h2d_gb_s == max(f.h2d_gb_s for f in rates if f is not None)


def test_the_27b_compute_sessions_merge_and_keep_the_stored_layout(tmp_path: Path) -> None:
    """The real-compute screening's two H200 sessions (one OFF-ON pair each, a day apart):
    one report of two block pairs; the first session predates the stored-layout field, the
    second knows it, so the merged floor keeps the layout (a full hit's 262,144 B a token)."""
    first, second = H200 / "perf-27b-compiled-s1.json", H200 / "perf-27b-compiled-s2.json"
    out = tmp_path / "merged.json"
    assert main([str(out), str(first), str(second)]) == 0
    merged = merged_analysis(out)
    assert merged.pairing.ok
    assert {r.block_pairs for r in merged.ratios} == {2}
    assert all(r.interval is None for r in merged.ratios)  # an interval needs three
    assert load(out)["perf"]["block_pairs"] == [0, 0, 1, 1]
    older = from_json(load(first)["perf"]).floor
    assert older is not None and older.stored_bytes_per_token is None
    assert merged.run.floor is not None
    assert merged.run.floor.stored_bytes_per_token == 262_144
    cross = {r.size: [ratio for _, ratio in r.per_pair] for r in merged.ratios
             if r.step == "cross" and r.arms == "ON/OFF"}
    assert set(cross) == {"8k", "32k", "128k"}
    assert all(len(ratios) == 2 and max(ratios) < 0.2  # the pool pays off at every size
               for ratios in cross.values())


SESSIONS = tuple(H200 / f"perf-27b-compiled-s{n}.json" for n in (1, 2, 3))


def test_three_27b_compute_sessions_give_an_interval(tmp_path: Path) -> None:
    """The three H200 sessions (one OFF-ON pair each, on fresh machines): three block pairs,
    so every ratio has its bootstrap interval, and the pool's cross-replica speed-up holds
    across the whole interval at every size."""
    out = tmp_path / "merged.json"
    assert main([str(out), *map(str, SESSIONS)]) == 0
    merged = merged_analysis(out)
    assert merged.pairing.ok
    assert load(out)["perf"]["block_pairs"] == [0, 0, 1, 1, 2, 2]
    assert {r.block_pairs for r in merged.ratios} == {3}
    assert all(r.interval is not None for r in merged.ratios)
    cross = {r.size: r.interval for r in merged.ratios
             if r.step == "cross" and r.arms == "ON/OFF"}
    assert set(cross) == {"8k", "32k", "128k"}
    assert all(i is not None and i.high < 0.2 for i in cross.values())
    assert all(s.interval is not None for s in merged.session_ratios)


NATIVE_SESSION = H200 / "perf-27b-compiled-native1.json"


def test_the_native_session_merges_beside_the_three_on_sessions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The H200's OFF-NATIVE session (asked for 256k too; the host dropped it with its
    reason) merges with the three OFF-ON ones: four OFF blocks, ON with its interval over
    three pairs, NATIVE on one pair beside it (not judged), and NATIVE's cross-replica
    requests no faster than OFF (vLLM's own offloading is not shared between replicas)."""
    out = tmp_path / "merged.json"
    assert main([str(out), *map(str, SESSIONS), str(NATIVE_SESSION)]) == 0
    assert "merged from 4 separate runs" in capsys.readouterr().out
    data = load(out)["perf"]
    assert data["blocks"] == ["OFF", "ON"] * 3 + ["OFF", "NATIVE"]
    assert data["block_pairs"] == [0, 0, 1, 1, 2, 2, 3, 3]
    merged = merged_analysis(out)
    assert merged.pairing.ok
    cross = {(r.size, r.arms): r for r in merged.ratios if r.step == "cross"}
    assert {r.block_pairs for (_, arms), r in cross.items() if arms == "ON/OFF"} == {3}
    assert all(cross[size, "ON/OFF"].interval is not None for size in ("8k", "32k", "128k"))
    native = [cross[size, "NATIVE/OFF"] for size in ("8k", "32k", "128k")]
    assert all(r.block_pairs == 1 and r.interval is None for r in native)
    assert all(0.95 < r.median < 1.05 for r in native)
    assert "256k" not in {o.size for o in merged.run.observations}


def test_the_merged_screening_keeps_model_settings_and_launches(tmp_path: Path) -> None:
    """merge_runs' own PerfRun (what plots and compare read) holds the served model, the
    engine settings and every block's launch, in block order; where one run lacks its
    launches (an older report) the merge carries none rather than misnumber them."""
    runs = [read_report(p) for p in (*SESSIONS, NATIVE_SESSION)]
    merged = merge_runs(runs)
    first = runs[0].perf
    assert first is not None
    assert merged.model == first.run.model and merged.model["kind"] == "27b-compute"
    assert merged.engine_settings == first.run.engine_settings
    assert [x["arm"] for x in merged.launches] == merged.blocks
    older = load(SESSIONS[1])
    del older["perf"]["launches"]
    mixed = merge_runs([runs[0], read_report(write(tmp_path, "older.json", older))])
    assert mixed.launches == [] and mixed.model == merged.model


def test_a_stored_layout_that_differs_is_refused(tmp_path: Path) -> None:
    second = load(H200 / "perf-27b-compiled-s2.json")
    other = copy.deepcopy(second)
    other["perf"]["floor"]["stored_bytes_per_token"] = 65_536
    a, b = write(tmp_path, "a.json", second), write(tmp_path, "b.json", other)
    assert main([str(tmp_path / "out.json"), str(a), str(b)]) == 2
    assert not (tmp_path / "out.json").exists()


def test_a_session_on_the_other_kernel_path_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A session whose LMCache ran its torch fallback (a cuda_ops build that did not load)
    does not merge with one on the compiled kernels: the same flags, another stack."""
    second = load(H200 / "perf-27b-compiled-s2.json")
    fallback = copy.deepcopy(second)
    fallback["environment"]["lmcache"].update(kernel_path="torch-fallback", kernel_module=None)
    a, b = write(tmp_path, "a.json", second), write(tmp_path, "b.json", fallback)
    assert main([str(tmp_path / "out.json"), str(a), str(b)]) == 2
    assert not (tmp_path / "out.json").exists()
    err = capsys.readouterr().err
    assert "b.json" in err and "environment.lmcache.kernel_path" in err, err
    unknown = rerun(second)  # an older report that recorded no kernel path merges
    del unknown["environment"]["lmcache"]
    c = write(tmp_path, "c.json", unknown)
    assert main([str(tmp_path / "ok.json"), str(a), str(c)]) == 0


def test_a_session_on_another_replica_placement_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both replicas on one GPU do not merge with one replica per GPU, recorded
    (perf.replica_placement) or set (an older report's --sharedkv-pair-gpus); a run that
    recorded neither merges, and the merged report keeps the placement recorded."""
    second = load(H200 / "perf-27b-compiled-s2.json")
    one = copy.deepcopy(second)
    one["perf"]["replica_placement"] = {"pair_gpus": 1, "replicas": {"A": "0", "B": "0"}}
    two = copy.deepcopy(second)
    two["perf"]["replica_placement"] = {"pair_gpus": 2, "replicas": {"A": "0", "B": "1"}}
    set_two = copy.deepcopy(second)
    set_two["environment"]["settings"]["pair_gpus"] = "2"
    unknown = rerun(second)
    del unknown["environment"]["settings"]["pair_gpus"]
    a = write(tmp_path, "a.json", one)
    for name, data, field in (("b.json", two, "perf.replica_placement.pair_gpus"),
                              ("c.json", set_two, "environment.settings.pair_gpus")):
        other = write(tmp_path, name, data)
        assert main([str(tmp_path / "out.json"), str(a), str(other)]) == 2
        err = capsys.readouterr().err
        assert f"{other}: {field} (replica placement) differs from {a}: 2 here, 1 there" \
            in err, err
        assert "Traceback" not in err
        assert not (tmp_path / "out.json").exists()
    out = tmp_path / "ok.json"
    assert main([str(out), str(write(tmp_path, "d.json", unknown)), str(a)]) == 0
    assert load(out)["perf"]["replica_placement"] == one["perf"]["replica_placement"]


def test_compare_between_the_two_27b_compute_sessions(
        capsys: pytest.CaptureFixture[str]) -> None:
    """compare on two real-compute screenings: same model, corpus, flags and kernel path,
    no correctness difference; cells that moved >10% are not judged on one pair a side."""
    first, second = H200 / "perf-27b-compiled-s1.json", H200 / "perf-27b-compiled-s2.json"
    assert compare_main([str(first), str(second)]) == 0
    text = capsys.readouterr().out
    assert "RESULT: OK: no correctness difference, no significant regression" in text
    assert "FLAGS DIFFER" not in text and "ARMS DIFFER" not in text
    assert "AFTER LMCache 0.5.6 on compiled (lmcache.cuda_ops)" in text


def test_compare_the_first_two_sessions_against_the_third(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compare on real-compute screenings of separate runs (blocks 1-2 merged against block
    3): OK, the cells that moved are counted, none judged on one pair a side."""
    first_two = tmp_path / "s1-s2.json"
    assert main([str(first_two), *map(str, SESSIONS[:2])]) == 0
    capsys.readouterr()
    assert compare_main([str(first_two), str(SESSIONS[2])]) == 0
    text = capsys.readouterr().out
    assert "RESULT: OK: no correctness difference, no significant regression" in text
    assert "FLAGS DIFFER" not in text and "ARMS DIFFER" not in text
    assert "BEFORE 2, AFTER 1 block pairs" in text
    assert ("merged from 2 separate runs (created 2026-12-01T13:49:04+00:00, "
            "2026-12-02T01:46:03+00:00)") in text
    assert text.count("merged from") == 1  # AFTER is one run


def test_compare_reads_a_merged_report(tmp_path: Path, halves: tuple[Path, Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged.json"
    assert main([str(out), *map(str, halves)]) == 0
    assert compare_main([str(SCREENING), str(out)]) == 0
    text = capsys.readouterr().out
    assert "RESULT" in text


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "pytest_sharedkv", "merge-screenings",
                           *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_command_line_exit_codes(tmp_path: Path, halves: tuple[Path, Path]) -> None:
    out = tmp_path / "merged.json"
    done = cli(out, *halves)
    assert done.returncode == 0, done.stderr
    again = cli(out, *halves)
    assert again.returncode == 2 and "exists (give --force" in again.stderr
    assert cli(out, *halves, "--force").returncode == 0
    one = cli(tmp_path / "x.json", halves[0])
    assert one.returncode == 2 and "two or more" in one.stderr
    missing = cli(tmp_path / "y.json", halves[0], tmp_path / "nope.json")
    assert missing.returncode == 2 and "nope.json: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.parametrize("inputs", ["same file twice", "same file three times",
                                    "a copy under another name", "a run the merged input holds"])
def test_the_same_run_twice_is_refused_naming_both_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], halves: tuple[Path, Path],
        inputs: str) -> None:
    """A run is known by its observations, not its file name: given twice (the same path, a
    copy, or inside a merged input) it is refused, so no block pair counts twice."""
    first, second = halves
    copy_of = write(tmp_path, "copy.json", load(second))
    merged = tmp_path / "merged.json"
    assert main([str(merged), str(first), str(second)]) == 0
    capsys.readouterr()
    given, earlier, later = {
        "same file twice": ([first, second, first], f"IN.json #1 {first}",
                            f"IN.json #3 {first}"),
        "same file three times": ([second, second, second], f"IN.json #1 {second}",
                                  f"IN.json #2 {second}"),
        "a copy under another name": ([second, copy_of], f"IN.json #1 {second}",
                                      f"IN.json #2 {copy_of}"),
        "a run the merged input holds": ([merged, second],
                                         f"run 2 of IN.json #1 {merged} (from {second})",
                                         f"IN.json #2 {second}"),
    }[inputs]
    out = tmp_path / "out.json"
    assert main([str(out), *map(str, given)]) == 2
    err = capsys.readouterr().err
    created = load(second)["created"]
    assert err.startswith(f"python -m pytest_sharedkv merge-screenings: {given[-1]}: the same "
                          "run twice: ")
    assert f"{later}, created {created} holds the same " in err
    assert f"observations and sessions as {earlier}, created {created} (sha256 " in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_a_merged_report_that_holds_one_run_twice_is_refused(
        tmp_path: Path, halves: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A report merged before repeats were refused (here: made by hand) is refused as an
    input, naming its two runs."""
    good = tmp_path / "good.json"
    assert main([str(good), *map(str, halves)]) == 0
    doubled = load(good)
    runs = doubled["perf"]["runs"]
    second = {**runs[1], "first_block": runs[1]["first_block"] + runs[1]["blocks"],
              "first_pair": runs[1]["first_pair"] + runs[1]["pairs"]}
    perf = doubled["perf"]
    extra = [dict(o, block=o["block"] + 2, pair=o["pair"] + 1)
             for o in perf["observations"] if o["block"] >= 4]
    sessions = [dict(s, block=s["block"] + 2, pair=s["pair"] + 1)
                for s in perf["sessions"] if s["block"] >= 4]
    perf.update(runs=[*runs, second], blocks=[*perf["blocks"], "OFF", "ON"],
                block_pairs=[*perf["block_pairs"], 3, 3],
                observations=[*perf["observations"], *extra],
                sessions=[*perf["sessions"], *sessions])
    path = write(tmp_path, "doubled.json", doubled)
    capsys.readouterr()
    assert main([str(tmp_path / "out.json"), str(path), str(SCREENING)]) == 2
    err = capsys.readouterr().err
    assert f"run 3 of IN.json #1 {path} (from {halves[1]})" in err
    assert f"as run 2 of IN.json #1 {path} (from {halves[1]})" in err


def test_a_hosts_session_without_128k_merges_on_the_sizes_both_screened(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The OFF-HOSTS session on the one-GPU H200 drops 128k (one request's 34.4 GB over a
    HOSTS server's 32 GB): its corpus digest is that of 8k and 32k. Beside the three OFF-ON
    sessions it merges on 8k and 32k, request by request, and the note says which runs
    hold 128k; HOSTS gets its ratios at 8k and 32k from its one pair, ON keeps its
    interval at every size. (The HOSTS run here is the third ON session relabelled, its
    cross TTFTs 1.5x; the H200's own HOSTS session: tests/test_perf_hosts_h200.py.)"""
    hosts = relabel(load(SESSIONS[2]), "ON", "HOSTS", factor=1.5)
    perf = hosts["perf"]
    perf["observations"] = [o for o in perf["observations"] if o["size"] != "128k"]
    perf["corpus_digest"] = "8k-and-32k-only"
    out = tmp_path / "merged.json"
    assert main([str(out), *map(str, SESSIONS), str(write(tmp_path, "hosts.json", hosts))]) == 0
    merged = merged_analysis(out)
    assert merged.pairing.ok
    assert any(n.startswith("sizes differ between runs: 128k in runs 1, 2, 3; each size's "
                            "ratios use the block pairs that screened it")
               for n in merged.run.notes), merged.run.notes
    cross = {(r.size, r.arms): r for r in merged.ratios if r.step == "cross"}
    assert {size for size, arms in cross if arms == "HOSTS/OFF"} == {"8k", "32k"}
    assert all(cross[size, "HOSTS/OFF"].block_pairs == 1 for size in ("8k", "32k"))
    assert all(cross[size, "ON/OFF"].block_pairs == 3 and cross[size, "ON/OFF"].interval
               is not None for size in ("8k", "32k", "128k"))
    # a shared size whose payloads differ is still refused, naming the request
    wrong = copy.deepcopy(hosts)
    next(o for o in wrong["perf"]["observations"] if o["size"] == "8k")["payload_sha256"] = \
        "0" * 64
    assert main([str(tmp_path / "no.json"), str(SESSIONS[0]),
                 str(write(tmp_path, "wrong.json", wrong))]) == 2
    assert "payload_sha256 (corpus, request" in capsys.readouterr().err
