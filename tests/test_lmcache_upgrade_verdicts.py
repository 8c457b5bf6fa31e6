"""``compare`` between the real H200 service reports (fixtures/lmcache/h200/): the upgrade an
operator on a torch-2.11 host makes when a newer LMCache wheel silently loses its compiled
kernels (compiled -> fallback, LMCache 0.5.6 on both sides) must FAIL, naming the lost
kernel path and every request that diverged; going back to the compiled path passes; a
clean report against itself passes. What each recorded run measured is read through the
product (compare's reader and kernel path, the records, the service tier's exact-pair
rule and verdicts, the triage's classification, the ordering verdicts, the summary's
tables), so a reader, rule or format change that misreads a real run fails here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.cli.compare.correctness import findings, void_tiers
from pytest_sharedkv.cli.compare.finding import Found
from pytest_sharedkv.cli.compare.flags import fact_settings
from pytest_sharedkv.cli.compare.kernels import describe, lmcache_of
from pytest_sharedkv.cli.compare.main import main
from pytest_sharedkv.cli.compare.reading import Report, setting_of
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.terminal import check_table
from pytest_sharedkv.service.baseline import exact_pair
from pytest_sharedkv.service.summary import verdicts
from pytest_sharedkv.service.triage import Base, Cell, classify, controls_for
from tests.recorded import checks, read, records, run_log

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


def _triage_cells(service: list[Check], allocator: str) -> list[Cell]:
    """The triage's cells of ALLOCATOR's pair as its records keep them."""
    controls = {c.name: c for c in controls_for(allocator)}
    return [Cell(controls[c.key["step"]], requests=c.trials, exact=c.passed,
                 errors=int(c.detail["errors"]), mismatches=c.detail["mismatches"],
                 compared=int(c.detail["compared"]),
                 not_applicable=c.message if c.status == "info" else None)
            for c in service if c.key.get("size") == "triage"
            and c.key.get("allocator") == allocator]


def test_the_fallback_triage_is_what_the_h200_measured() -> None:
    """LMCache 0.5.6 on its torch fallback, lazy, copy model, 3k, audit on, one H200: 25 of
    200 cross-replica answers wrong; CUDA_LAUNCH_BLOCKING=1 (server only, and everywhere), a
    device synchronize around every server KV transfer and the mixed allocator removed it
    (200/200, no mismatching digest); one request in flight did not. The triage's own
    classification of the recorded cells is the run's verdict: a stream-ordering race."""
    report = read(FALLBACK)
    assert (lmcache_of(report) or {}).get("kernel_path") == "torch-fallback"
    service = checks(report, "service_regression")
    cells = {c.control.name: (c.exact, c.requests, c.status, c.mismatches)
             for c in _triage_cells(service, "lazy")}
    assert cells == {"one-in-flight": (181, 200, "fail", 16140),
                     "launch-blocking-all": (200, 200, "pass", 0),
                     "launch-blocking-server": (200, 200, "pass", 0),
                     "sync-transfers": (200, 200, "pass", 0),
                     "other-allocator": (200, 200, "pass", 0)}
    wrong = [f for f in findings(report)
             if f.kind is Found.DIVERGENCE and "size=3k, step=chain" in f.subject]
    cross = [c for c in service if c.key.get("size") == "3k" and c.key.get("step") == "cross"]
    base = Base("lazy", "3k", sum(c.trials for c in cross), len(wrong), None)
    assert (base.requests, base.wrong) == (200, 25)
    found = classify(base, _triage_cells(service, "lazy"))
    assert found.klass == "ordering"
    assert found.text == ("stream-ordering race (removed by CUDA_LAUNCH_BLOCKING=1 in the "
                          "LMCache server and both replicas, CUDA_LAUNCH_BLOCKING=1 in the "
                          "LMCache server only, a device synchronize before and after every "
                          "KV transfer in the server)")
    [note] = [n.text for n in run_log(report).bundle.notes if n.kind == "triage-verdict"]
    assert note.startswith(f"TRIAGE lazy: {found.text} (the pass: 25 of 200 3k cross-replica "
                           "answers wrong, 9,490 mismatching digests)")


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
    every step 200/200 with its gate proven and its audit passed over 21,246 digests (its 8
    mismatching digests are the gate's zeroed chunk in its 8 control requests, a positive
    control split off before the record), so the pair is exact and compare finds nothing."""
    report = read(COMPILED)
    assert describe(lmcache_of(report)) == "LMCache 0.5.6 on compiled (lmcache.cuda_ops)"
    service = checks(report, "service_regression")
    assert findings(report) == []
    assert exact_pair(service, "lazy") == (200, 200)
    assert [v for v in verdicts(service) if v.startswith("VERDICT")][-1].startswith(
        "VERDICT lazy: 200/200 requests exact in every step (cold, local, cross-replica, "
        "receiver-local)")
    [audit] = [c for c in service if c.kind == "audit-mismatch"]
    assert (audit.status, audit.detail["compared"]) == ("pass", 21246)
    [gate] = [c for c in service if c.key.get("size") == "gate"]
    assert (gate.kind, gate.status) == ("gate", "pass")


def test_0_5_3_on_its_compiled_c_ops_is_what_the_h200_measured() -> None:
    """LMCache 0.5.3 as released (its c_ops loads against torch 2.11), the replica tier, with
    the one-block-a-step window its connector asks of a hybrid model: both launched pairs
    3/3 exact, 3,008 of 3,009 tokens a prompt from the pool; the flags are in the report.
    Its transfer cells failed on 0.5.3's client API (the provider bridges it since)."""
    report = read(RELEASED_053)
    assert describe(lmcache_of(report)) == "LMCache 0.5.3 on compiled (lmcache.c_ops)"
    pair = checks(report, "replica_pair")
    pairs = {c.key["allocator"]: (c.passed, c.trials, c.status,
                                  [p["b_external"] for p in c.detail["prompts"]])
             for c in pair if c.key["provider"] == "vllm"}
    assert pairs == {a: (3, 3, "pass", [3008] * 3) for a in ("lazy", "mixed")}
    settings = fact_settings(report)
    assert settings is not None and settings["extra_args"] == [
        "--max-num-batched-tokens", "16", "--max-num-seqs", "16"]
    assert len([f for f in findings(report) if f.kind is Found.FAILED]) == 3
    transfer = [c for c in pair if c.key["provider"].startswith("transfer")]
    assert len(transfer) == 3 and all(c.status == "fail" and "dcp_size" in c.message
                                      for c in transfer)


def test_the_transfer_bridge_moves_every_byte_through_0_5_3() -> None:
    """The transfer provider on LMCache 0.5.3's client API (no dcp_size, no layout_hints on
    register, its own recorded event), through the real server on CPU and on the GPU."""
    report = read(TRANSFER_053)
    assert describe(lmcache_of(report)) == "LMCache 0.5.3 on compiled (lmcache.c_ops)"
    cells = {c.key["provider"]: (c.passed, c.trials, c.status)
             for c in checks(report, "replica_pair")}
    assert cells == {"transfer (cpu)": (256, 256, "pass"), "transfer (cuda)": (256, 256, "pass")}
    assert findings(report) == []


def test_0_5_3_copies_on_its_compiled_c_ops_are_stream_ordered() -> None:
    """The ordering tier on 0.5.3's c_ops: both allocators' gpu_ops helpers held every
    delayed and undelayed check while the negative control saw stale bytes in every delayed
    one. Its lmcache-fallback and lmcache-device-ops cells, and packed_page, died on
    ImportErrors of 0.5.6's names (host.lmcache_api finds 0.5.3's since: ORDERING_053)."""
    from pytest_sharedkv.ordering.summary import sensitivity_line, verdict_lines

    report = read(TIERS_053)
    assert (lmcache_of(report) or {}).get("kernel_path") == "compiled"
    ordering = checks(report, "ordering")
    sensitive, line = sensitivity_line(ordering)
    assert sensitive and "saw stale bytes in 60/60 delayed checks" in line
    lines = verdict_lines(ordering, sensitive)
    for helper in ("lmcache-lazy-helper", "lmcache-mixed-helper"):
        assert (f"VERDICT {helper} [under-test]: stream-ordered (60/60 delayed and 60/60 "
                "undelayed checks held)") in lines
    died = [f for f in findings(report) if f.kind is Found.FAILED]
    assert len(died) == 69 and all(f.message.startswith("ImportError") for f in died)


def test_the_0_5_3_service_run_is_void_and_is_no_baseline_for_the_upgrade(
        capsys: pytest.CaptureFixture[str]) -> None:
    """0.5.3 compiled -> 0.5.6 fallback, the upgrade an operator on a torch-2.11 host makes:
    the 0.5.3 service run's gate hook wrapped 0.5.6's module only (VOID; its progress line
    had 200/200 cross answers as constructed), so its failures are no baseline: the compare
    FAILS with the lost kernel path and every one of the 25 divergent requests as NEW."""
    before = read(SERVICE_053)
    [gate] = [c for c in checks(before, "service_regression") if c.key.get("size") == "gate"]
    assert (gate.status, gate.kind, gate.detail["zeroed_chunks_logged"]) == ("void", "gate", 0)
    assert void_tiers(before) == {"service_regression"}
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


def _exact(path: Path, allocator: str, lmcache: tuple[str, str]) -> Report:
    """A service report whose ALLOCATOR pair the product judges exact: every 3k step
    200/200 with its gate and audit records held, a verdict saying so, nothing compare
    finds wrong, on LMCACHE (its version and kernel path, as compare reads them)."""
    report = read(path)
    found = lmcache_of(report)
    assert found is not None and (found["version"], found["kernel_path"]) == lmcache
    service = checks(report, "service_regression")
    assert exact_pair(service, allocator) == (200, 200)
    assert [v for v in verdicts(service) if v.startswith("VERDICT")][-1].startswith(
        f"VERDICT {allocator}: 200/200 requests exact in every step (cold, local, "
        "cross-replica, receiver-local)")
    assert findings(report) == []
    return report


def _exact_on_0_5_3(path: Path, allocator: str) -> Report:
    """A 0.5.3 compiled service report, exact, its audit passed over all 21,302 digests."""
    report = _exact(path, allocator, ("0.5.3", "compiled"))
    assert describe(lmcache_of(report)) == "LMCache 0.5.3 on compiled (lmcache.c_ops)"
    [audit] = [c for c in checks(report, "service_regression") if c.kind == "audit-mismatch"]
    assert (audit.status, audit.detail["compared"]) == ("pass", 21302)
    return report


def test_0_5_3_lazy_on_its_compiled_c_ops_is_exact_and_losing_them_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    """LMCache 0.5.3 as released, lazy, 3k, audit on, with the gate that wraps 0.5.3's
    transfer function and the one-block-a-step window at block 32: every step 200/200, the
    gate proven, the audit's 8 mismatches the gate's chunk. The upgrade to 0.5.6 on its
    fallback (the kernel path lost) FAILS against this real baseline, naming the path and
    every one of the 25 divergent requests as NEW."""
    settings = fact_settings(_exact_on_0_5_3(SERVICE_053_LAZY, "lazy"))
    assert settings is not None and settings["extra_args"] == [
        "--block-size", "32", "--max-num-batched-tokens", "32", "--max-num-seqs", "16"]
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
    report = _exact_on_0_5_3(SERVICE_053_MIXED, "mixed")
    assert setting_of(report, "allocators") == ["mixed"]
    # the recurrent share is in the audit's note alone (its record keeps the total)
    [line] = [n.text for n in records(report).notes if n.text.startswith("KV AUDIT mixed: ")]
    assert "(20828 attention KV, 474 recurrent state)" in line
    assert "8 mismatching digests in 8 requests" in line
    assert fact_settings(report) == fact_settings(read(SERVICE_053_LAZY))

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
    _exact(FALLBACK_MIXED, "mixed", ("0.5.6", "torch-fallback"))
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

    report = read(SHARED_CHECK_053)
    assert describe(lmcache_of(report)) == "LMCache 0.5.3 on compiled (lmcache.c_ops)"
    assert findings(report) == [] and run_log(report).counts()["failed"] == 0
    _held_as_on_the_h200(SHARED_CHECK_053, SHARED_CHECK_053, COMPILED_TAKES_CUDA_ONLY)
    assert run_log(report).counts("ordering")["xfailed"] == 6


def _held_as_on_the_h200(ordering: Path, packed_page: Path, refusal: str) -> None:
    """What LMCache binds held every check; its fallback saw stale bytes in every delayed
    one; packed_page's cells as the summary's table counts them: 28 byte-exact, and every
    cell on CPU that went through the bound c_ops an xfail naming them."""
    from pytest_sharedkv.ordering.summary import verdict_lines

    lines = verdict_lines(checks(read(ordering), "ordering"))
    assert ("VERDICT lmcache-device-ops [under-test]: stream-ordered (60/60 delayed and 60/60 "
            "undelayed checks held)") in lines
    assert ("VERDICT lmcache-fallback [under-test; reference, not the path under test]: NOT "
            "stream-ordered: 60/60 delayed checks saw stale bytes") in lines
    report = read(packed_page)
    counts = run_log(report).counts("packed_page")
    assert (counts["passed"], counts["xfailed"]) == (28, 49)
    packed = checks(report, "packed_page")
    refused = [c for c in packed if c.status == "xfail" and c.message.startswith(refusal)]
    assert len(refused) == 29 and {c.key["device"] for c in refused} == {"cpu"}
    rows = check_table(refused, None)[2:]  # the summary's cells: xfail, not 0/0
    assert len(rows) == 29 and all(row.rstrip(" |").endswith("| xfail") for row in rows)


def test_cpu_kv_through_0_5_6_compiled_kernels_is_the_same_xfail() -> None:
    """0.5.6 with its cuda_ops built against torch 2.11: the 22 server cells on CPU KV
    (which failed inside LMCache before) are xfails naming the bound kernels; its
    engine-driven CPU path, which does not reach them, stays a byte-exact check."""
    from pytest_sharedkv.packed_page.round_trip import COMPILED_TAKES_CUDA_ONLY

    report = read(PACKED_056)
    assert describe(lmcache_of(report)) == "LMCache 0.5.6 on compiled (lmcache.cuda_ops)"
    packed = checks(report, "packed_page")
    refused = [c for c in packed
               if c.status == "xfail" and c.message.startswith(COMPILED_TAKES_CUDA_ONLY)]
    assert {c.key["path"] for c in refused} == {"server", "server-separate"}
    assert len(refused) == 22
    passed = {(c.key["device"], c.key["path"]) for c in packed if c.status == "pass"}
    assert ("cpu", "engine-driven") in passed and ("cuda", "kernel-native") in passed
    assert findings(report) == [] and run_log(report).counts()["failed"] == 0
