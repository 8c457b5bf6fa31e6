"""``compare`` between the real H200 service reports (fixtures/lmcache/h200/): the upgrade an
operator on a torch-2.11 host makes when a newer LMCache wheel silently loses its compiled
kernels (compiled -> fallback, LMCache 0.5.6 on both sides) must FAIL, naming the lost
kernel path and every request that diverged; going back to the compiled path passes; a
clean report against itself passes. The fallback report's triage is held to what it
measured, so a reader or format change that misreads it fails here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.main import main

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "lmcache" / "h200"
# lazy, audit on, gate proven: written by this plugin version
COMPILED = H200 / "service-0.5.6-compiled-lazy-audit.json"
COMPILED_VOID = H200 / "service-0.5.6-compiled-lazy-run2.json"  # its hooks did not load
COMPILED_CLEAN = H200 / "service-0.5.6-compiled.json"  # lazy + mixed, an older report
FALLBACK = H200 / "service-0.5.6-fallback-lazy-triage2.json"  # hooks loaded: every cell real
RELEASED_053 = H200 / "replica_pair-0.5.3-compiled.json"  # its c_ops as released
TRANSFER_053 = H200 / "transfer-0.5.3-compiled.json"  # the client-API bridge on a GPU
TIERS_053 = H200 / "tiers-0.5.3-compiled.json"  # ordering, packed_page, pinned_pool, replica
SERVICE_053 = H200 / "service-0.5.3-compiled-gate-void.json"  # the gate's hook missed 0.5.3
SERVICE_053_LAZY = H200 / "service-0.5.3-compiled-lazy.json"  # the gate mended: proven
ORDERING_053 = H200 / "ordering-packed_page-0.5.3-compiled.json"  # host.lmcache_api in
PACKED_053 = H200 / "packed_page-0.5.3-compiled.json"  # CPU KV through c_ops: xfails
FALLBACK_MIXED = H200 / "service-0.5.6-fallback-mixed.json"  # the fallback's other allocator
PACKED_056 = H200 / "packed_page-0.5.6-compiled-xfail.json"  # its built cuda_ops bound
SERVICE_053_MIXED = H200 / "service-0.5.3-compiled-mixed.json"  # the other allocator
# ordering + packed_page again, with the one shared bound-kernels check (host.lmcache_status)
SHARED_CHECK_053 = H200 / "ordering-packed_page-0.5.3-shared-check.json"


def _compare(capsys: pytest.CaptureFixture[str], before: Path, after: Path) -> tuple[int, str]:
    status = main([str(before), str(after)])
    return status, capsys.readouterr().out


def _diverged(path: Path) -> list[str]:
    data: dict[str, Any] = json.loads(path.read_text())
    return sorted(c["detail"]["case"] for c in data["checks"]
                  if c["key"].get("step") == "chain" and c["kind"] == "divergence"
                  and c["key"].get("size") == "3k")


def test_losing_the_compiled_kernels_fails_naming_the_path_and_every_divergent_request(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _compare(capsys, COMPILED, FALLBACK)
    assert status == 1
    assert "- LMCache: BEFORE LMCache 0.5.6 on compiled (lmcache.cuda_ops); AFTER LMCache " \
        "0.5.6 on torch-fallback: ImportError:" in out
    assert "| NEW | kernel path lost | LMCache 0.5.6 -> 0.5.6 | BEFORE ran LMCache's " \
        "compiled kernels (lmcache.cuda_ops); AFTER runs torch-fallback" in " ".join(
            out.split())
    diverged = _diverged(FALLBACK)
    assert len(diverged) == 25
    for case in diverged:
        assert f"step=chain, case={case}]" in out, case


def test_back_to_the_compiled_path_passes(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _compare(capsys, FALLBACK, COMPILED_CLEAN)
    assert status == 0, out
    assert "RESULT: OK: no correctness difference" in out


def test_a_clean_report_against_itself_passes(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _compare(capsys, COMPILED_CLEAN, COMPILED_CLEAN)
    assert status == 0 and "RESULT: OK" in out


def test_the_fallback_triage_is_what_the_h200_measured() -> None:
    """LMCache 0.5.6 on its torch fallback, lazy, copy model, 3k, audit on, one H200: 25 of
    200 cross-replica answers wrong; CUDA_LAUNCH_BLOCKING=1 (server only, and everywhere), a
    device synchronize around every server KV transfer and the mixed allocator removed it
    (200/200, no mismatching digest); one request in flight did not."""
    data: dict[str, Any] = json.loads(FALLBACK.read_text())
    assert data["environment"]["lmcache"]["kernel_path"] == "torch-fallback"
    cells = {c["key"]["step"]: (c["passed"], c["trials"], c["status"],
                                c["detail"]["mismatches"]) for c in data["checks"]
             if c["key"].get("size") == "triage"}
    assert cells == {"one-in-flight": (181, 200, "fail", 16140),
                     "launch-blocking-all": (200, 200, "pass", 0),
                     "launch-blocking-server": (200, 200, "pass", 0),
                     "sync-transfers": (200, 200, "pass", 0),
                     "other-allocator": (200, 200, "pass", 0)}
    verdict = [n["text"] for n in data["notes"] if n["kind"] == "triage-verdict"]
    assert verdict == ["TRIAGE lazy: stream-ordering race (removed by CUDA_LAUNCH_BLOCKING=1 "
                       "in the LMCache server and both replicas, CUDA_LAUNCH_BLOCKING=1 in the "
                       "LMCache server only, a device synchronize before and after every KV "
                       "transfer in the server) (the pass: 25 of 200 3k cross-replica answers "
                       "wrong, 9,490 mismatching digests)"]


def test_the_compiled_run_proves_the_compiled_kernels_remedy_and_a_void_one_proves_none(
        ) -> None:
    """Given as --sharedkv-baseline to the fallback run, the compiled lazy report (200/200
    exact, its audit's only mismatches the gate's own, the gate proven) proves the
    compiled-kernels remedy for the fallback's lazy pair; the run whose hooks did not load
    (gate and audit VOID) proves nothing; neither proves the other allocator (lazy only)."""
    from pytest_sharedkv.service.baseline import read_baseline, remedies

    clean = read_baseline(COMPILED)
    assert clean.kernel_path == "compiled" and clean.pair("lazy") is not None
    assert remedies(clean, "lazy", "torch-fallback") == [
        "run LMCache's compiled kernels, a build that loads against this torch (proven by "
        "the baseline service-0.5.6-compiled-lazy-audit.json: LMCache 0.5.6 on compiled "
        "(lmcache.cuda_ops): the lazy pair answered 200/200 cross-replica requests exact)"]
    assert remedies(clean, "lazy", "compiled") == []  # no kernel path to gain
    assert remedies(read_baseline(COMPILED_VOID), "lazy", "torch-fallback") == []


def test_the_compiled_lazy_audit_is_what_the_h200_measured() -> None:
    """LMCache 0.5.6 with cuda_ops built against torch 2.11, lazy, copy model, 3k, audit on:
    every step 200/200, and the audit's 8 mismatching digests are the gate's zeroed chunk in
    its 8 control requests (a positive control, not a fault)."""
    data: dict[str, Any] = json.loads(COMPILED.read_text())
    assert data["environment"]["lmcache"]["kernel_path"] == "compiled"
    steps = {c["key"]["step"]: (c["passed"], c["trials"]) for c in data["checks"]
             if c["key"].get("size") == "3k" and c["key"].get("step") != "chain"}
    assert steps == {s: (200, 200) for s in ("cold", "local", "cross", "receiver-local")}
    audit = next(c for c in data["checks"] if c["kind"] == "audit-mismatch")
    assert audit["status"] == "pass" and audit["detail"]["compared"] == 21246
    gate = next(c for c in data["checks"] if c["key"].get("size") == "gate")
    assert gate["status"] == "pass"


def test_0_5_3_on_its_compiled_c_ops_is_what_the_h200_measured() -> None:
    """LMCache 0.5.3 as released (its c_ops loads against torch 2.11), the replica tier, with
    the one-block-a-step window its connector asks of a hybrid model: both launched pairs
    3/3 exact, 3,008 of 3,009 tokens a prompt from the pool; the flags are in the report.
    Its transfer cells failed on 0.5.3's client API (the provider bridges it since)."""
    data: dict[str, Any] = json.loads(RELEASED_053.read_text())
    lmcache = data["environment"]["lmcache"]
    assert (lmcache["version"], lmcache["kernel_path"]) == ("0.5.3", "compiled")
    pairs = {c["key"]["allocator"]: (c["passed"], c["trials"], c["status"],
                                     [p["b_external"] for p in c["detail"]["prompts"]])
             for c in data["checks"] if c["key"]["provider"] == "vllm"}
    assert pairs == {a: (3, 3, "pass", [3008] * 3) for a in ("lazy", "mixed")}
    settings = [json.loads(f["value"]) for f in data["facts"] if f["name"] == "engine_settings"]
    assert settings and all(s["extra_args"] == ["--max-num-batched-tokens", "16",
                                                "--max-num-seqs", "16"] for s in settings)
    transfer = [c for c in data["checks"] if c["key"]["provider"].startswith("transfer")]
    assert len(transfer) == 3 and all("dcp_size" in c["message"] for c in transfer)


def test_the_transfer_bridge_moves_every_byte_through_0_5_3() -> None:
    """The transfer provider on LMCache 0.5.3's client API (no dcp_size, no layout_hints on
    register, its own recorded event), through the real server on CPU and on the GPU."""
    data: dict[str, Any] = json.loads(TRANSFER_053.read_text())
    assert data["environment"]["lmcache"]["key"] == "lmcache-0.5.3-compiled-c_ops"
    cells = {c["key"]["provider"]: (c["passed"], c["trials"], c["status"])
             for c in data["checks"]}
    assert cells == {"transfer (cpu)": (256, 256, "pass"), "transfer (cuda)": (256, 256, "pass")}


def test_0_5_3_copies_on_its_compiled_c_ops_are_stream_ordered() -> None:
    """The ordering tier on 0.5.3's c_ops: both allocators' gpu_ops helpers held every
    delayed and undelayed check while the negative control saw stale bytes in every delayed
    one. Its lmcache-fallback and lmcache-device-ops cells, and packed_page, died on
    ImportErrors of 0.5.6's names (host.lmcache_api finds 0.5.3's since: ORDERING_053)."""
    data: dict[str, Any] = json.loads(TIERS_053.read_text())
    assert data["environment"]["lmcache"]["kernel_path"] == "compiled"
    ordering = [c for c in data["checks"] if c["tier"] == "ordering"]
    helpers = [c for c in ordering if c["key"]["target"].endswith("-helper")]
    assert {c["key"]["target"] for c in helpers} == {"lmcache-lazy-helper",
                                                     "lmcache-mixed-helper"}
    assert sum(c["passed"] for c in helpers) == sum(c["trials"] for c in helpers) == 240
    negative = [c for c in ordering if c["role"] == "negative-control"
                and c["detail"]["delay_cycles"] > 0]
    assert len(negative) == 6 and sum(c["passed"] for c in negative) == 0
    died = [t for t in data["tests"] if t["outcome"] == "failed"]
    assert len(died) == 69 and all(t["message"].startswith("ImportError") for t in died)


def test_the_0_5_3_service_run_is_void_and_is_no_baseline_for_the_upgrade(
        capsys: pytest.CaptureFixture[str]) -> None:
    """0.5.3 compiled -> 0.5.6 fallback, the upgrade an operator on a torch-2.11 host makes:
    the 0.5.3 service run's gate hook wrapped 0.5.6's module only (VOID; its progress line
    had 200/200 cross answers as constructed), so its failures are no baseline: the compare
    FAILS with the lost kernel path and every one of the 25 divergent requests as NEW."""
    data: dict[str, Any] = json.loads(SERVICE_053.read_text())
    [gate] = [c for c in data["checks"] if c["key"].get("size") == "gate"]
    assert (gate["status"], gate["kind"], gate["detail"]["status"]) == ("void", "gate", "VOID")
    assert gate["detail"]["zeroed_chunks_logged"] == 0
    status, out = _compare(capsys, SERVICE_053, FALLBACK)
    flat = " ".join(out.split())
    assert status == 1
    assert "BEFORE VOID in service_regression: BEFORE proved nothing there" in out
    assert "also in BEFORE |" not in out
    assert "| NEW | kernel path lost | LMCache 0.5.3 -> 0.5.6 | BEFORE ran LMCache's " \
        "compiled kernels (lmcache.c_ops); AFTER runs torch-fallback" in flat
    for case in _diverged(FALLBACK):
        assert f"| NEW | divergence | service_regression [provider=vllm, allocator=lazy, " \
            f"delay=0, size=3k, step=chain, case={case}]" in flat, case


def _steps(path: Path) -> dict[str, tuple[int, int]]:
    data: dict[str, Any] = json.loads(path.read_text())
    return {c["key"]["step"]: (c["passed"], c["trials"]) for c in data["checks"]
            if c["key"].get("size") == "3k" and c["key"].get("step") != "chain"}


def _exact_on_0_5_3(path: Path) -> dict[str, Any]:
    """A 0.5.3 compiled service report: every 3k step 200/200, the gate proven, the audit
    passed over all 21,302 digests."""
    data: dict[str, Any] = json.loads(path.read_text())
    assert data["environment"]["lmcache"]["key"] == "lmcache-0.5.3-compiled-c_ops"
    assert _steps(path) == {s: (200, 200) for s in ("cold", "local", "cross", "receiver-local")}
    [gate] = [c for c in data["checks"] if c["key"].get("size") == "gate"]
    assert gate["status"] == "pass"
    [audit] = [c for c in data["checks"] if c["kind"] == "audit-mismatch"]
    assert (audit["status"], audit["detail"]["compared"]) == ("pass", 21302)
    return data


def test_0_5_3_lazy_on_its_compiled_c_ops_is_exact_and_losing_them_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    """LMCache 0.5.3 as released, lazy, 3k, audit on, with the gate that wraps 0.5.3's
    transfer function and the one-block-a-step window at block 32: every step 200/200, the
    gate proven, the audit's 8 mismatches the gate's chunk. The upgrade to 0.5.6 on its
    fallback (the kernel path lost) FAILS against this real baseline, naming the path and
    every one of the 25 divergent requests as NEW."""
    data = _exact_on_0_5_3(SERVICE_053_LAZY)
    settings = [json.loads(f["value"]) for f in data["facts"] if f["name"] == "engine_settings"]
    assert settings and all(s["extra_args"] == ["--block-size", "32", "--max-num-batched-tokens",
                                                "32", "--max-num-seqs", "16"] for s in settings)
    status, out = _compare(capsys, SERVICE_053_LAZY, FALLBACK)
    flat = " ".join(out.split())
    assert status == 1
    assert "BEFORE VOID" not in out
    assert "| NEW | kernel path lost | LMCache 0.5.3 -> 0.5.6 | BEFORE ran LMCache's " \
        "compiled kernels (lmcache.c_ops); AFTER runs torch-fallback" in flat
    assert "FLAGS DIFFER: extra_args:" in out
    for case in _diverged(FALLBACK):
        assert f"step=chain, case={case}]" in flat, case


def test_0_5_3_mixed_on_its_compiled_c_ops_is_exact_and_counts_its_recurrent_state(
        capsys: pytest.CaptureFixture[str]) -> None:
    """LMCache 0.5.3 as released on the mixed allocator, with the lazy run's flags: every step
    200/200, the gate proven, the audit's 8 mismatches the gate's chunk, and the audit now
    counting 0.5.3's state pages as recurrent state (its lazy twin, before the hook read
    vLLM's registration, counted 0). lazy -> mixed on one release and kernel path is an
    allocator switch that passes; the upgrade to 0.5.6's fallback on the same allocator
    answers every request right and still FAILS on the one difference it has: the compiled
    kernels lost."""
    data = _exact_on_0_5_3(SERVICE_053_MIXED)
    assert data["environment"]["settings"]["allocators"] == ["mixed"]
    [line] = [n["text"] for n in data["notes"] if n["text"].startswith("KV AUDIT mixed: ")]
    assert "(20828 attention KV, 474 recurrent state)" in line
    assert "8 mismatching digests in 8 requests" in line
    lazy: dict[str, Any] = json.loads(SERVICE_053_LAZY.read_text())
    assert [json.loads(f["value"])["extra_args"] for f in data["facts"]
            if f["name"] == "engine_settings"] == [
        json.loads(f["value"])["extra_args"] for f in lazy["facts"]
        if f["name"] == "engine_settings"]

    status, out = _compare(capsys, SERVICE_053_LAZY, SERVICE_053_MIXED)
    assert status == 0, out
    assert "ALLOCATOR SWITCH: BEFORE ran lazy, AFTER mixed" in out
    assert "FLAGS DIFFER" not in out
    status, out = _compare(capsys, SERVICE_053_MIXED, FALLBACK_MIXED)
    flat = " ".join(out.split())
    assert status == 1
    assert "RESULT: FAIL: 1 new correctness difference(s)" in out
    assert "| NEW | kernel path lost | LMCache 0.5.3 -> 0.5.6 | BEFORE ran LMCache's " \
        "compiled kernels (lmcache.c_ops); AFTER runs torch-fallback" in flat
    status, out = _compare(capsys, SERVICE_053_MIXED, SERVICE_053_MIXED)
    assert status == 0 and "RESULT: OK" in out


def test_lazy_to_mixed_on_the_fallback_passes_and_back_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    """LMCache 0.5.6 on its fallback: the mixed pair answered 200/200 in every step (gate
    proven). lazy -> mixed is the allocator switch that removed the fault (OK); mixed ->
    lazy FAILS with each divergent lazy request judged against its mixed twin."""
    assert _steps(FALLBACK_MIXED) == {
        s: (200, 200) for s in ("cold", "local", "cross", "receiver-local")}
    status, out = _compare(capsys, FALLBACK, FALLBACK_MIXED)
    assert status == 0, out
    assert "ALLOCATOR SWITCH: BEFORE ran lazy, AFTER mixed" in out
    status, out = _compare(capsys, FALLBACK_MIXED, FALLBACK)
    flat = " ".join(out.split())
    assert status == 1 and "ALLOCATOR SWITCH: BEFORE ran mixed, AFTER lazy" in out
    for case in _diverged(FALLBACK):
        assert f"step=chain, case={case}]" in flat, case


def test_0_5_3_ordering_and_packed_page_through_host_lmcache_api() -> None:
    """0.5.3 on the H200 once host.lmcache_api found its names: what LMCache binds
    (lmcache-device-ops, c_ops) held 60/60 delayed and undelayed; the torch fallback it
    ships, called directly, saw stale bytes in 60/60 delayed checks (reference, not the
    path it runs here). packed_page: 28 cells byte-exact; the 29 that send CPU-resident KV
    through the bound c_ops are xfails saying so, with the 20 hybrid-by-design ones."""
    from pytest_sharedkv.packed_page.round_trip import COMPILED_TAKES_CUDA_ONLY

    _held_as_on_the_h200(ORDERING_053, PACKED_053, COMPILED_TAKES_CUDA_ONLY)


def test_the_shared_bound_kernels_check_gives_0_5_3_the_same_cells_on_the_h200() -> None:
    """host.lmcache_status holds the one check of whether the compiled kernels are bound
    (the probe, the ordering tier and packed_page's xfails read it): rerun on the H200 with
    0.5.3 it decides the same cells as the copies it replaced did."""
    from pytest_sharedkv.packed_page.round_trip import COMPILED_TAKES_CUDA_ONLY

    data: dict[str, Any] = json.loads(SHARED_CHECK_053.read_text())
    assert data["environment"]["lmcache"]["key"] == "lmcache-0.5.3-compiled-c_ops"
    assert data["summary"]["failed"] == 0
    _held_as_on_the_h200(SHARED_CHECK_053, SHARED_CHECK_053, COMPILED_TAKES_CUDA_ONLY)
    assert [t["outcome"] for t in data["tests"] if "test_ordering" in t["nodeid"]].count(
        "xfailed") == 6


def _held_as_on_the_h200(ordering: Path, packed_page: Path, refusal: str) -> None:
    data: dict[str, Any] = json.loads(ordering.read_text())
    by: dict[tuple[str, bool], list[int]] = {}
    for c in data["checks"]:
        if c["tier"] == "ordering":
            cell = by.setdefault((c["key"]["target"], c["detail"]["delay_cycles"] > 0), [0, 0])
            cell[0] += c["passed"]
            cell[1] += c["trials"]
    assert by[("lmcache-device-ops", True)] == by[("lmcache-device-ops", False)] == [60, 60]
    assert by[("lmcache-fallback", True)] == [0, 60]
    packed: dict[str, Any] = json.loads(packed_page.read_text())
    outcomes = sorted(t["outcome"] for t in packed["tests"] if "test_packed_page" in t["nodeid"])
    assert outcomes.count("passed") == 28 and outcomes.count("xfailed") == 49
    refused = [c for c in packed["checks"] if c["status"] == "xfail"
               and c["message"].startswith(refusal)]
    assert len(refused) == 29 and {c["key"]["device"] for c in refused} == {"cpu"}


def test_cpu_kv_through_0_5_6_compiled_kernels_is_the_same_xfail() -> None:
    """0.5.6 with its cuda_ops built against torch 2.11: the 22 server cells on CPU KV
    (which failed inside LMCache before) are xfails naming the bound kernels; its
    engine-driven CPU path, which does not reach them, stays a byte-exact check."""
    from pytest_sharedkv.packed_page.round_trip import COMPILED_TAKES_CUDA_ONLY

    data: dict[str, Any] = json.loads(PACKED_056.read_text())
    assert data["environment"]["lmcache"]["key"] == "lmcache-0.5.6-compiled-cuda_ops"
    refused = {c["key"]["path"] for c in data["checks"] if c["status"] == "xfail"
               and c["message"].startswith(COMPILED_TAKES_CUDA_ONLY)}
    assert refused == {"server", "server-separate"}
    assert sum(c["status"] == "xfail" and c["message"].startswith(COMPILED_TAKES_CUDA_ONLY)
               for c in data["checks"]) == 22
    passed = {(c["key"]["device"], c["key"]["path"]) for c in data["checks"]
              if c["status"] == "pass"}
    assert ("cpu", "engine-driven") in passed and ("cuda", "kernel-native") in passed
    assert [t["outcome"] for t in data["tests"]].count("failed") == 0
