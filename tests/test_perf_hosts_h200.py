"""The perf tier's OFF-HOSTS block pair on the one-GPU H200 (2026-12-03,
``fixtures/perf/h200/perf-27b-compiled-hosts1.*``: the 27b-compute model, LMCache 0.5.6
compiled, two LMCache servers sharing an ``fs`` L2, sizes 8k and 32k, 128k dropped by name),
read as the product reads it, merged beside the three OFF-ON sessions, and the servers'
own account of where B's keys came from (``-servers.log``: both LMCache servers' logs and
replica B's vLLM stats lines, each after a ``== <block dir>/<log>`` line)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pytest_sharedkv.cli.merge import main
from pytest_sharedkv.perf.observations import PerfRun, from_json
from pytest_sharedkv.perf.statistics import analyse
from pytest_sharedkv.perf.tables import report_lines
from pytest_sharedkv.stack.l2.log import ANSI, RETAINED
from tests.h200_logs import H200, sections

HOSTS = H200 / "perf-27b-compiled-hosts1.json"
SESSIONS = [H200 / f"perf-27b-compiled-s{i}.json" for i in (1, 2, 3)]
MS = re.compile(r"retained keys \(\d+ L1, \d+ L2\) in (?P<ms>[0-9.]+) ms")


def _run(path: Path = HOSTS) -> PerfRun:
    return from_json(json.loads(path.read_text())["perf"])


def test_the_hosts_session_analyses_as_printed() -> None:
    """OFF then HOSTS, 8k and 32k (128k dropped with its reason: one request's 34.5 GB
    over a HOSTS server's 32 GB), the fs L2's read rate measured in the run, every HOSTS
    cross-replica request a full pool hit, and the cross medians the GPU printed: the L2
    hop keeps HOSTS faster than OFF (0.72x, 0.53x) and far slower than one host's pool."""
    run = _run()
    assert run.blocks == ["OFF", "HOSTS"]
    assert {o.size for o in run.observations} == {"8k", "32k"}
    pool = next(n for n in run.notes if n.startswith("pool: "))
    assert "32 GB of L1 each" in pool
    assert "128k dropped (one request stores 34.5 GB, more than the 32 GB each of the HOSTS " \
        "arm's two LMCache servers may pin" in pool
    assert run.floor is not None and round(run.floor.l2_gb_s or 0, 2) == 1.88
    analysis = analyse(run)
    medians = {(size, arm, step): round(cell.median_ttft_s, 3)
               for size in ("8k", "32k") for arm in ("OFF", "HOSTS")
               for step in ("cross", "receiver-local")
               for cell in [analysis.cell(size, arm, step)] if cell is not None}
    assert medians == {("8k", "OFF", "cross"): 0.535, ("8k", "HOSTS", "cross"): 0.384,
                       ("32k", "OFF", "cross"): 2.486, ("32k", "HOSTS", "cross"): 1.304,
                       ("8k", "OFF", "receiver-local"): 0.032,
                       ("8k", "HOSTS", "receiver-local"): 0.326,
                       ("32k", "OFF", "receiver-local"): 0.079,
                       ("32k", "HOSTS", "receiver-local"): 1.22}
    text = "\n".join(report_lines(analysis))
    assert "VERDICT hits: all 6 HOSTS cross-replica requests were full pool hits" in text
    assert "L2 floor s | x L2 floor" in text
    assert "| 32k  | HOSTS | 32,929        | 0.042   | 1.304          | 31.1x   | 0.156" in text


def test_merged_beside_the_three_on_sessions_hosts_pays_for_its_hop(tmp_path: Path) -> None:
    """With the three OFF-ON sessions: four OFF blocks, ON's intervals at every size, HOSTS
    on its one pair at 8k and 32k (not judged), its cross TTFT about six times ON's."""
    out = tmp_path / "merged.json"
    assert main([str(out), *map(str, SESSIONS), str(HOSTS)]) == 0
    analysis = analyse(_run(out))
    assert analysis.pairing.ok
    cross = {(r.size, r.arms): r for r in analysis.ratios if r.step == "cross"}
    assert {size for size, arms in cross if arms == "HOSTS/OFF"} == {"8k", "32k"}
    assert [round(cross[s, "HOSTS/OFF"].median, 3) for s in ("8k", "32k")] == [0.718, 0.526]
    assert all(cross[s, "HOSTS/OFF"].interval is None for s in ("8k", "32k"))
    assert all(cross[s, "ON/OFF"].block_pairs == 3 and cross[s, "ON/OFF"].interval is not None
               for s in ("8k", "32k", "128k"))
    on = {s: analysis.cell(s, "ON", "cross") for s in ("8k", "32k")}
    hosts = {s: analysis.cell(s, "HOSTS", "cross") for s in ("8k", "32k")}
    ratio = {s: hosts[s].median_ttft_s / on[s].median_ttft_s  # type: ignore[union-attr]
             for s in on}
    assert 4.5 < ratio["8k"] < 5.5 and 5.5 < ratio["32k"] < 6.5, ratio
    assert any(n.startswith("sizes differ between runs: 128k in runs 1, 2, 3")
               for n in analysis.run.notes)


def _server_of_b(run: PerfRun) -> str:
    """The log name of the LMCache server replica B of the HOSTS block talked to, from
    the block's launch record (its --kv-transfer-config's port)."""
    hosts = next(b for b in run.launches if b.get("arm") == "HOSTS")
    b = next(p for p in hosts["processes"] if p["name"] == "vllm replica B")
    port = re.search(r'"lmcache.mp.port": (\d+)', " ".join(b["argv"]))
    assert port is not None
    return f"lmcache-server-{port[1]}.log"


def test_server_two_loads_every_key_from_the_l2_on_the_cross_step_and_again_after() -> None:
    """B's server (found through the launch record) never holds what B reloads: each
    cross-replica lookup, 5 keys at 8k and 21 at 32k, came all from the L2, and so did the
    receiver-local lookup of the same prompt right after it (LMCache 0.5.6's default
    prefetch policy keeps nothing it loads from L2 in L1: ``DefaultPrefetchPolicy.
    plan_l1_retention``), each 32k load taking more than a second, about what the
    receiver-local step's 1.22 s median TTFT cost; A's server answered its own lookups
    from L1."""
    logs = sections(H200 / "perf-27b-compiled-hosts1-servers.log")
    server_b = _server_of_b(_run())
    b_log = next(text for name, text in logs.items() if name.endswith(server_b))
    a_log = next(text for name, text in logs.items()
                 if "lmcache-server-" in name and not name.endswith(server_b))
    lookups = [(int(m["retained"]), int(m["requested"]), int(m["l1"]), int(m["l2"]))
               for m in RETAINED.finditer(ANSI.sub("", b_log))]
    # 8k: three cross, three receiver-local; 32k the same; then the sessions
    assert lookups[:12] == [(5, 5, 0, 5)] * 6 + [(21, 21, 0, 21)] * 6
    assert all(l1 == 0 for _, _, l1, _ in lookups)
    times = [float(m["ms"]) for m in MS.finditer(b_log)][6:12]
    assert all(1000 < ms < 1200 for ms in times), times
    assert all(l2 == 0 for m in RETAINED.finditer(ANSI.sub("", a_log))
               for l2 in [int(m["l2"])])
