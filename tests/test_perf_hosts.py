"""The perf tier's HOSTS arm: its blocks launch in the hosts topology (one server per
replica sharing --sharedkv-l2) through the same launch path as ON; on the stub its B
finds A's KV through the shared L2 only, so its cross step is a full hit and the ratio
table holds HOSTS/OFF. The L2 floor: the L2's read rate measured through the suite's own
client, beside the H2D floor in the floor table. One in-process stub run (OFF-HOSTS)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_sharedkv.perf.floor import FloorError, measure_l2_read_gb_s
from pytest_sharedkv.perf.observations import Floor, PerfRun, from_json, to_json
from pytest_sharedkv.perf.pairing import pair_observations
from pytest_sharedkv.perf.statistics import analyse
from pytest_sharedkv.perf.tables import hit_verdict
from pytest_sharedkv.stack.l2.backends import DirectoryL2
from tests.test_perf_suite import TTFT_PLAN, _shares, small_plan


def test_hosts_is_screened_against_off_through_the_l2(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = pytester.runpytest(*small_plan(pytester, monkeypatch, TTFT_PLAN),
                                "--sharedkv-provider=stub", "--sharedkv-json=r.json",
                                "--sharedkv-blocks=1", "--sharedkv-perf-arms=HOSTS")
    result.assert_outcomes(passed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    run = from_json(report["perf"])
    assert run.blocks == ["OFF", "HOSTS"] and run.block_pairs == [0, 0]
    assert _shares(run, "cross") == {"OFF": 0.0, "HOSTS": 1.0}
    analysis = analyse(run)
    assert [(r.size, r.arms) for r in analysis.ratios if r.step == "cross"] == [
        ("3k", "HOSTS/OFF")]
    assert pair_observations(run.observations, run.blocks, run.block_pairs).ok
    assert hit_verdict(analysis) == ("VERDICT hits: all 3 HOSTS cross-replica requests were "
                                     "full pool hits (every whole chunk of the prompt from "
                                     "a cache); HOSTS: 3 of 3 from B's server's L2 by its "
                                     "own log (144 keys from the L2, 0 from its L1)")
    # each HOSTS request on B carries B's server's account; nothing else does
    hosts_b = [o for o in run.observations if o.arm == "HOSTS" and o.replica == "B"
               and not o.warmup]
    assert hosts_b and all(o.l2_keys is not None for o in hosts_b if o.step == "cross")
    assert all(o.l1_keys is None and o.l2_keys is None for o in run.observations
               if o.arm == "OFF" or o.replica == "A")
    assert not [o for o in report["perf"]["observations"] if o["arm"] == "OFF"
                and "l2_keys" in o]  # left out where not read
    # the HOSTS block: two stubs, each its own L1, sharing only the session's fs L2
    argv = [p["argv"] for p in run.launches[1]["processes"]]
    pools = [Path(a[a.index("--pool") + 1]).name for a in argv]
    adapters = [json.loads(a[a.index("--l2-adapter") + 1])["type"] for a in argv]
    assert pools == ["stub-l1-A", "stub-l1-B"] and adapters == ["fs", "fs"]
    assert all("--l2-adapter" not in a for p in run.launches[0]["processes"]
               for a in p["argv"])  # OFF: no L2
    result.stdout.fnmatch_lines(["*HOSTS/OFF*"])


def test_a_hosts_cross_request_served_from_bs_own_l1_is_refused(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub's two "hosts" keeping one L1 (B's server saw A's KV): B's server logs its
    cross-replica keys from its L1, so the HOSTS TTFT timed no L2 hop, and the perf test
    fails naming the request and the split."""
    from tests.launch_faults import LaunchFaults, Planted, StubFaults

    result = pytester.runpytest(
        *small_plan(pytester, monkeypatch, TTFT_PLAN), "--sharedkv-provider=stub",
        "--sharedkv-json=r.json", "--sharedkv-blocks=1", "--sharedkv-perf-arms=HOSTS",
        plugins=[Planted(LaunchFaults(stub=StubFaults(hosts_share_l1=True)))])
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*HOSTS cross on B): B's server took * keys from its L1 "
                                 "and 0 from the L2, so this TTFT did not time the L2*"])


def test_the_l2_read_rate_and_its_floor(tmp_path: Path) -> None:
    l2 = DirectoryL2(tmp_path / "l2")
    l2.start()
    rate = measure_l2_read_gb_s(l2, nbytes=1 << 20, repeats=2)
    assert rate > 0 and list((tmp_path / "l2").iterdir()) == []  # the probe removed
    floor = Floor(h2d_gb_s=50.0, kv_bytes_per_token=1000, recurrent_bytes_per_sequence=0,
                  source="test", stored_bytes_per_token=4000, l2_gb_s=2.0)
    assert floor.l2_seconds(1000) == pytest.approx(4000 * 1000 / 2e9)
    assert Floor(50.0, 1000, 0, "t").l2_seconds(1000) is None
    with pytest.raises(FloorError, match="refused"):
        measure_l2_read_gb_s(DirectoryL2(tmp_path / "absent" / "l2"), nbytes=16)


def test_the_floor_table_shows_the_l2_floor_beside_the_h2d_floor() -> None:
    """The H200 27b-compute screening with an L2 read rate of 2 GB/s: each cross row gets
    the stored bytes at that rate and the TTFT over it; a report without the rate has no
    such column, and the rate survives the JSON round trip."""
    from pytest_sharedkv.perf.tables import floor_table
    from tests.test_perf_h200_reports import _run

    run = _run("perf-27b-compiled-s1")
    assert run.floor is not None
    assert "L2 floor" not in "\n".join(floor_table(analyse(run)))
    hosts = replace(run, floor=replace(run.floor, stored_bytes_per_token=262_144,
                                       l2_gb_s=2.0))
    table = floor_table(analyse(hosts))
    assert "L2 floor (the HOSTS arm's extra hop): the 262,144 bytes" in table[0]
    row = next(r for r in table if r.startswith("| 128k | ON"))
    # 131,713 tokens x 262,144 bytes at 2 GB/s: 17.264 s; the ON median 0.801 s is 0.05x
    assert "| 17.264 " in row and "| 0.05x " in row, row
    back = from_json(json.loads(json.dumps(to_json(hosts))))
    assert back.floor is not None and back.floor.l2_gb_s == 2.0
    assert "l2_gb_s" not in to_json(run)["floor"]


def _as_hosts(run: PerfRun) -> PerfRun:
    """The seeded screening with its ON blocks screened as HOSTS."""
    def arm(name: str) -> str:
        return "HOSTS" if name == "ON" else name

    return replace(run, blocks=[arm(b) for b in run.blocks],
                   observations=[replace(o, arm=arm(o.arm)) for o in run.observations],
                   sessions=[replace(s, arm=arm(s.arm)) for s in run.sessions])


def test_compare_judges_the_hosts_arm(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    """HOSTS 20% slower in AFTER is a regression of HOSTS's cell; against an OFF-ON
    screening, HOSTS and ON are each named as one side's arm alone, not compared and not
    missing (a pool on one host is not the pool across hosts)."""
    from tests.test_perf_compare import SCREENING, run, slower, with_arms, write

    baseline = json.loads(SCREENING.read_text())
    before = write(tmp_path, "before.json", with_arms(baseline, _as_hosts))
    after = write(tmp_path, "after.json",
                  slower(with_arms(baseline, _as_hosts), 1.2, arm="HOSTS"))
    status, out, _ = run(capsys, before, after)
    assert status == 1, out
    (row,) = [line for line in out.splitlines() if "REGRESSION" in line]
    assert row.startswith("| 8k   | HOSTS | cross"), row
    status, out, _ = run(capsys, SCREENING, before)
    assert ("ARMS DIFFER: ON only in BEFORE (3 block pairs); HOSTS only in AFTER (3 block "
            "pairs): their cells are not compared; judged: the arms both screened (OFF)") \
        in out and "MISSING" not in out, out


def test_the_l2_wait_grows_with_the_bytes_a_token_stores() -> None:
    """The perf tier's 32k step on the 27B geometry stores 3 x 32,929 tokens at 262,144 B
    (25.9 GB) into the L2: a deadline of 60 s + 20 µs a token (62 s) would end the wait
    while an fs L2 at CPU's measured 176 MB/s still writes (147 s); at the slowest rate
    counted (60 MB/s) it waits up to 60 + 431.6 s. A model without known bytes keeps the
    token rate."""
    from pytest_sharedkv.stack.topology import l2_deadline_s

    tokens = 3 * 32_929
    assert l2_deadline_s(tokens) == pytest.approx(60 + 20e-6 * tokens)
    assert l2_deadline_s(tokens, 262_144) == pytest.approx(60 + tokens * 262_144 / 60e6)
    assert l2_deadline_s(tokens, 262_144) > tokens * 262_144 / 176e6
    assert l2_deadline_s(tokens, 64) == l2_deadline_s(tokens)  # the token rate is the floor


def test_what_bs_server_said_reads_as_origin_reloads_and_unknown() -> None:
    """l2_origin counts the HOSTS cross requests B's server served from its L2 and says
    which it logged nothing for (unknown, not zero); l2_reloads names the receiver-local
    requests that waited for the L2 again (the H200's 32k receiver-local step: 21 keys
    each); a report from before the fields reads with both None."""
    from pytest_sharedkv.perf.hits import l2_origin, l2_reloads, not_from_l2
    from pytest_sharedkv.perf.observations import Observation

    def obs(step: str, l1: int | None, l2: int | None, request: str = "32k-00") -> Observation:
        return Observation("HOSTS", 1, 0, "32k", step, request, "0" * 64, "B", 32929, 16,
                           1.3, 95.0, 1.5, cached_tokens=32928, l1_keys=l1, l2_keys=l2)

    cross = [obs("cross", 0, 21), obs("cross", None, None, "32k-01")]
    assert l2_origin(cross) == ("HOSTS: 1 of 2 from B's server's L2 by its own log (21 keys "
                                "from the L2, 0 from its L1); 1 with no lookup logged "
                                "(unknown)")
    assert not_from_l2(cross) == []
    assert l2_origin([obs("cross", None, None)]).startswith(  # type: ignore[union-attr]
        "HOSTS: where B's server took the keys is unknown")
    assert l2_reloads([obs("receiver-local", 0, 21)] * 3) == (
        "NOTE hits: 3 HOSTS receiver-local request(s) waited for B's server to load 63 keys "
        "from the L2 again (its own log), after the cross-replica step had loaded them: "
        "their TTFT holds that load")
    assert l2_reloads([obs("receiver-local", 21, 0)]) is None
    recorded = from_json(json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "perf"
                                     / "h200" / "perf-27b-compiled-hosts1.json").read_text())
                         ["perf"])
    assert {(o.l1_keys, o.l2_keys) for o in recorded.observations} == {(None, None)}
