"""The H200 runs across hosts (fixtures/lmcache/h200/hosts-*: LMCache 0.5.6 with its
compiled cuda_ops, two servers sharing only an ``fs`` L2, the copy model, mixed allocator,
KV audit on) read as the product reads a report: what the service tier computes from them.
"""

from __future__ import annotations

import pytest

from pytest_sharedkv.cli.compare.correctness import findings
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.terminal import verdict
from pytest_sharedkv.service.baseline import exact_pair
from pytest_sharedkv.service.summary import gap_verdicts, verdicts
from tests.recorded import LMCACHE_H200, checks, read, run_log

PASSES = {"hosts-0.5.6-compiled-fs-mixed.json": (8.0, {"server 1": 0, "server 2": 39104}),
          "hosts-0.5.6-compiled-fs-mixed-l1-0.5.json": (0.5, {"server 1": 27408,
                                                              "server 2": 39104})}


@pytest.mark.parametrize("name", sorted(PASSES))
def test_across_hosts_every_cross_replica_key_came_from_the_l2_and_every_answer_is_exact(
        name: str) -> None:
    """Server 2 never saw A's KV: its own account of the 3k cross step is 18,800 of 18,800
    keys from the L2, none from its L1; 200/200 answers exact in every step, the audit's
    only mismatches the gate's, and with an L1 of 0.5 GB server 1 evicted while it stored."""
    report = read(LMCACHE_H200 / name)
    service = checks(report, "service_regression")
    assert findings(report) == [] and verdict(run_log(report)) == "PASS"
    assert exact_pair(service, "mixed") == (200, 200)
    cross = next(c for c in service if c.key.get("size") == "3k"
                 and c.key.get("step") == "cross")
    split = cross.detail["hosts"]
    assert (split["retained"], split["requested"], split["l1"], split["l2"]) == (
        18800, 18800, 0, 18800)
    assert split["l2_wait"]["missing"] == []
    l1, evicted = PASSES[name]
    assert cross.detail["evictions"] == evicted
    servers = report.data["facts"]
    assert any(f'"l1_size_gb": {l1}' in f["value"] for f in servers if f["name"] == "topology")
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.kind, audit.status) == ("audit-mismatch", "pass")
    assert "VERDICT mixed: 200/200 requests exact in every step (cold, local, cross-replica, " \
        "receiver-local), hits as expected; sessions 48/48 turns, protocol 15/15" in \
        verdicts(service)


def test_a_failed_l2_load_trimmed_every_hit_to_the_prefix_and_one_answer_was_wrong() -> None:
    """Server 2 read the L2 through LMCache's fault_inject with gap_indices [4]: each of the
    8 lookups retained the 4 chunks before the gap (128 tokens, all from the L2, each
    byte-exact by the audit), and B recomputed the rest; 7 answers were exact and one
    (3k-004) was not. The cell's verdict says so, as a failure of its own kind."""
    report = read(LMCACHE_H200 / "hosts-0.5.6-compiled-fault-gap.json")
    [cell] = [c for c in checks(report, "service_regression")
              if str(c.key.get("step", "")).startswith("l2 fault gap")]
    assert (cell.kind, cell.status, cell.passed, cell.trials) == ("divergence", "fail", 7, 8)
    assert set(cell.detail["cached_by_request"].values()) == {4 * 32}
    hosts = cell.detail["hosts"]
    assert (hosts["retained"], hosts["l1"], hosts["l2"], hosts["requested"]) == (32, 0, 32, 752)
    assert cell.detail["audit"] == {"compared": 32, "mismatches": 0}
    server_2 = next(p for p in cell.detail["launches"] if p["name"].startswith("lmcache server 2"))
    assert '"type": "fault_inject"' in server_2["argv"][-1]
    assert verdict(run_log(report)) == "FAIL"
    [line] = gap_verdicts("mixed", [cell])
    assert line.startswith("L2 FAULT mixed: server 2's L2 failed to load chunk 4 of every "
                           "prompt (LMCache's fault_inject): FAIL (divergence): 7/8 held; "
                           "request 3k-004, step cross: first divergent token 0"), line
    # the run predates the cell's count of unjudged recurrent-state loads: unknown, not 0
    assert line.endswith("; KV audit: 32 digests compared, 0 differ from A's; "
                         "recurrent-state loads with no store by A (not judged): not "
                         "recorded"), line
    assert [x for x in verdicts([cell]) if x.startswith("VERDICT")] == []  # no 0/0 verdict


def _gap_cell(name: str) -> Check:
    report = read(LMCACHE_H200 / name)
    [cell] = [c for c in checks(report, "service_regression")
              if str(c.key.get("step", "")).startswith("l2 fault gap")]
    return cell


def test_with_the_gap_at_chunk_6_the_one_wrong_answer_moved_to_the_request_whose_source_follows_it(
        ) -> None:
    """Triage run A (docs/findings/2026-12-02-hosts.md): the same cell with the gap at chunk
    6. The wrong answer moved from 3k-004 (source 131 = 128 + 3) to 3k-006 (source 196 =
    192 + 4), the request whose source lies just after the new boundary, as the
    recurrent-state hypothesis predicts; every hit was 192 tokens, the 48 attention chunks
    exact, and B resumed from recurrent state A never stored in 16 loads (8 requests x the
    copy model's two Gated DeltaNet layers), none of them judged."""
    cell = _gap_cell("hosts-0.5.6-compiled-fault-gap-6.json")
    assert (cell.kind, cell.status, cell.passed, cell.trials) == ("divergence", "fail", 7, 8)
    assert set(cell.detail["cached_by_request"].values()) == {6 * 32}
    assert cell.detail["audit"] == {"compared": 48, "compared_state": 0, "unmatched": 16,
                                    "unmatched_state": 16, "mismatches": 0}
    [line] = gap_verdicts("mixed", [cell])
    assert "FAIL (divergence): 7/8 held; request 3k-006, step cross: first divergent token 0" \
        in line, line
    assert line.endswith("recurrent-state loads with no store by A (not judged): 16"), line


def test_with_scheduler_steps_on_chunk_boundaries_the_gap_cell_is_exact() -> None:
    """Triage run B: the gap at chunk 4 again, with vLLM scheduling 128 tokens a step and
    one sequence at a time (--max-num-batched-tokens 128 --max-num-seqs 1), so that A's
    prefill ends a step at every 128th token and keeps a recurrent state there: 8/8 exact,
    and the audit compared B's resumed state with A's (16 state digests, 0 unjudged)."""
    cell = _gap_cell("hosts-0.5.6-compiled-fault-gap-aligned-steps.json")
    assert (cell.status, cell.passed, cell.trials) == ("pass", 8, 8)
    assert set(cell.detail["cached_by_request"].values()) == {4 * 32}
    assert cell.detail["audit"] == {"compared": 48, "compared_state": 16, "unmatched": 0,
                                    "unmatched_state": 0, "mismatches": 0}
    engine = next(f for f in read(LMCACHE_H200 / "hosts-0.5.6-compiled-fault-gap-aligned-"
                                  "steps.json").data["facts"] if f["name"] == "engine_settings")
    assert '"--max-num-batched-tokens", "128", "--max-num-seqs", "1"' in engine["value"]
    [line] = gap_verdicts("mixed", [cell])
    assert line.startswith("L2 FAULT mixed: server 2's L2 failed to load chunk 4 of every "
                           "prompt (LMCache's fault_inject): 8/8 answers exact, each hit the "
                           "128 tokens before the gap and the rest recomputed"), line
    assert line.endswith("recurrent-state loads with no store by A (not judged): 0"), line
