"""Issue 48's controls on the L2 gap cell, run on an H100 on 2026-12-08
(fixtures/lmcache/h100/hybrid-gap4-*: LMCache 0.5.6 with cuda_ops built there, vLLM 0.26.0,
hosts topology over an ``fs`` L2, server 2 failing chunk 4 of every prompt, mixed, 8
measured 3k requests, four lanes on the one GPU at once), read as the product reads a
report, with the H200's 128-token-steps run of 2026-12-02 beside them; the triage verdict
is the one ``service/state_triage.py`` gives these cells' data."""

from __future__ import annotations

import pytest

from pytest_sharedkv.report.records import Check
from pytest_sharedkv.service.state_triage import Outcome, outcome_of, verdict
from pytest_sharedkv.service.summary import gap_verdicts
from tests.recorded import LMCACHE_H100, LMCACHE_H200, checks, read

# cell name -> (report, the triage control it is)
CELLS = {"base": (LMCACHE_H100 / "hybrid-gap4-base.json", None),
         "concurrency 1": (LMCACHE_H100 / "hybrid-gap4-conc1.json", "concurrency-1"),
         "--max-num-seqs 1": (LMCACHE_H100 / "hybrid-gap4-seqs1.json", "one-sequence"),
         "attention-only": (LMCACHE_H100 / "hybrid-gap4-attention.json", "attention-only"),
         "128-token steps (H200)": (
             LMCACHE_H200 / "hosts-0.5.6-compiled-fault-gap-aligned-steps.json",
             "steps-every-chunk")}
UNKEPT = [f"3k-00{i}" for i in range(8)]


def _cell(name: str) -> Check:
    [cell] = [c for c in checks(read(CELLS[name][0]), "service_regression")
              if str(c.key.get("step", "")).startswith("l2 fault gap")]
    return cell


def _outcome(cell: Check) -> Outcome:
    """The control's outcome from its record: the answers; the recurrent state judged where
    every state load was compared with A's (A's cold prefill kept a state at that chunk: a
    reference launch whose steps end there) or none was made; the loads of a state A never
    kept."""
    audit = cell.detail["audit"]
    judged = audit["unmatched_state"] == 0 and audit["mismatches"] == 0
    return outcome_of(cell.passed == cell.trials, True if judged else None,
                      audit["unmatched_state"])


@pytest.mark.parametrize("name", ["base", "concurrency 1", "--max-num-seqs 1"])
def test_the_wrong_answer_stays_without_the_recurrent_state_controls(name: str) -> None:
    """The base cell (this session's positive control), one request at a time, and one
    sequence a step with steps as large as the default: each 7/8, 3k-004 (source 131 = 128
    + 3) wrong from its first token, every hit the 128 tokens before the gap, and B resumed
    all 8 requests from a recurrent state A stored without one (16 loads: 8 x the copy
    model's two Gated DeltaNet layers), none judged. Neither concurrency nor batching is the
    cause."""
    cell = _cell(name)
    assert (cell.kind, cell.status, cell.passed, cell.trials) == ("divergence", "fail", 7, 8)
    assert set(cell.detail["cached_by_request"].values()) == {4 * 32}
    assert cell.detail["audit"] == {"compared": 32, "compared_state": 0, "unmatched": 16,
                                    "unmatched_state": 16, "mismatches": 0,
                                    "unkept_state_requests": UNKEPT}
    line, why = gap_verdicts("mixed", [cell])
    assert "FAIL (divergence): 7/8 held; request 3k-004, step cross: first divergent token 0" \
        in line, line
    assert why.startswith("  the 1 wrong answers all resumed B's recurrent layers from the "
                          "state of a chunk A stored without one"), why
    assert _outcome(cell) is Outcome.LEFT


def test_the_attention_only_model_is_exact_with_no_state_to_resume() -> None:
    """The same cell on the attention-only copy model: 8/8 exact, every hit 128 tokens, 64
    attention digests compared equal to A's, no recurrent-state load at all."""
    cell = _cell("attention-only")
    assert (cell.status, cell.passed, cell.trials) == ("pass", 8, 8)
    assert set(cell.detail["cached_by_request"].values()) == {4 * 32}
    assert cell.detail["audit"] == {"compared": 64, "compared_state": 0, "unmatched": 0,
                                    "unmatched_state": 0, "mismatches": 0,
                                    "unkept_state_requests": []}
    assert _outcome(cell) is Outcome.REMOVED


def test_the_runs_are_what_their_lanes_say() -> None:
    """Each lane's flags, from its report's settings: the controls differ from the base in
    the one thing each names; all ran on the H100."""
    settings = {name: read(path).data["environment"]["settings"]
                for name, (path, _) in CELLS.items() if path.parent == LMCACHE_H100}
    base = ["--gpu-memory-utilization", "0.05", "--kv-cache-memory-bytes", "2147483648"]
    assert {n: (s["vllm_args"], s["concurrency"], s["model"], s["l2_fault_gap"])
            for n, s in settings.items()} == {
        "base": (base, 8, None, 4), "concurrency 1": (base, 1, None, 4),
        "--max-num-seqs 1": ([*base, "--max-num-seqs", "1"], 8, None, 4),
        "attention-only": (base, 8, "/tmp/copy-attention", 4)}
    for name, (path, _) in CELLS.items():
        if path.parent == LMCACHE_H100:
            header = read(path).data["environment"]["header"]
            assert "NVIDIA H100 80GB HBM3" in header[1], name


def test_the_triage_names_the_recurrent_state_and_only_the_cells_that_removed_it() -> None:
    """The verdict from the cells' data: removed by the 128-token steps (H200, 2026-12-02)
    and by the attention-only model; left by concurrency 1 and by one sequence a step; the
    LMCache setting that would split object groups by layer kind is n/a (none named)."""
    outcomes = {control: _outcome(_cell(name)) for name, (_, control) in CELLS.items()
                if control is not None}
    outcomes["group-per-layer-kind"] = Outcome.NOT_APPLICABLE
    assert verdict(outcomes) == (
        "RECURRENT STATE TRIAGE: removed by steps-every-chunk: states kept only where a "
        "scheduler step ends (vLLM align mode) and loaded at chunks where none was kept; "
        "attention-only: the recurrent state itself (attention KV moves right) (others: "
        "one-sequence left, concurrency-1 left, group-per-layer-kind n/a)")


def test_the_lanes_walls_and_the_build_are_the_waves_own() -> None:
    """The wave's progress file (as wave-poll.sh brought it back): cuda_ops built in 73 s,
    the four lanes started 15 s apart, their walls 394, 390, 370 and 267 s, the hybrid
    lanes' exit 1 (the cell failed), the attention-only lane's 0."""
    lines = (LMCACHE_H100 / "hybrid-gap-wave-progress.txt").read_text().splitlines()
    ends = dict(line.split(" ", 2)[1:] for line in lines if " rc=" in line)
    assert ends == {"compile": "0.5.6 rc=0 wall=73", "gap4-base": "rc=1 wall=394",
                    "gap4-conc1": "rc=1 wall=390", "gap4-seqs1": "rc=1 wall=370",
                    "gap4-attention": "rc=0 wall=267"}
    assert lines[-1].endswith(" alldone")
