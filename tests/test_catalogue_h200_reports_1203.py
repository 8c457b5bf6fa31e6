"""The H200's catalogue and triage runs of 2026-12-03 (fixtures/lmcache/h200/), read as the
product reads a report: LMCache 0.5.6, copy model, 3k, KV audit on by default.

``service-0.5.6-compiled-lazy-catalogue-cut``: compiled cuda_ops, lazy,
``--sharedkv-fault-catalogue all``. ``service-0.5.6-fallback-mixed-catalogue-cut``: the
torch fallback, mixed, the same. ``service-0.5.6-fallback-lazy-triage48-cut``: the
fallback, lazy, 48 measured requests (``SHAREDKV_SERVICE_MEASURED``), ``--sharedkv-triage``.
A time limit killed each before pytest's summary (the logs end in the progress lines); each
catalogue cell and triage cell was recorded when judged, so the reports hold them.
``service-0.5.6-compiled-lazy-delay``: compiled, lazy, the delayed producer's cell alone.
``service-0.5.6-fallback-lazy-triage``: the fallback, lazy, 24 measured requests, the
triage to its verdict, beside ``service-0.5.6-compiled-mixed-delay`` (compiled, mixed, the
delayed producer's cell) on one GPU (``plans/triage-beside-mixed-delay.sh``)."""

from __future__ import annotations

import re

import pytest

from pytest_sharedkv.cli.compare.reading import Report
from pytest_sharedkv.report.records import Check
from pytest_sharedkv.report.terminal import verdict
from pytest_sharedkv.service import catalogue
from pytest_sharedkv.service.baseline import exact_pair
from pytest_sharedkv.service.summary import triage_table, verdicts
from tests.recorded import LMCACHE_H200, checks, read, run_log

LAZY = "service-0.5.6-compiled-lazy-catalogue-cut"
FALLBACK = "service-0.5.6-fallback-mixed-catalogue-cut"
TRIAGE = "service-0.5.6-fallback-lazy-triage48-cut"
DELAY = "service-0.5.6-compiled-lazy-delay"

# class -> (applications, faulted requests, wrong of 24, mismatching digests, caught by)
CELLS = {
    LAZY: {"misrouted": (8, 8, 0, 16, ["audit"]),
           "key-collision": (13, 13, 0, 13, ["audit"]),
           "lost-write": (15, 12, 0, 15, ["audit"]),
           "bit-flip": (10, 10, 0, 10, ["audit"]),
           "bit-flip-unread": (11, 11, 0, 0, []),
           "state-unrestored": (15, 15, 15, 30, ["answers", "audit"]),
           "state-foreign": (11, 11, 11, 22, ["answers", "audit"])},
    FALLBACK: {"misrouted": (12, 12, 0, 24, ["audit"]),
               "key-collision": (10, 10, 0, 10, ["audit"]),
               "lost-write": (19, 16, 0, 19, ["audit"]),
               "bit-flip": (7, 7, 0, 7, ["audit"]),
               "bit-flip-unread": (12, 12, 0, 0, []),
               "state-unrestored": (13, 13, 13, 26, ["answers", "audit"]),
               "state-foreign": (7, 7, 7, 14, ["answers", "audit"])},
}
# the pair's audit compared these many digests by the end of each cell (cumulative)
COMPARED = {"misrouted": 2688, "key-collision": 4992, "lost-write": 7296, "bit-flip": 9600,
            "bit-flip-unread": 11904, "state-unrestored": 14208, "state-foreign": 16512}


def _service(report: Report) -> list[Check]:
    return checks(report, "service_regression")


def _asked(report: Report) -> list[str]:
    """The classes the run chose, from its recorded option."""
    return [c.name for c in catalogue.chosen(report.data["environment"]["settings"]
                                             ["fault_catalogue"])]


def _finished(report: Report) -> set[str]:
    return {r.nodeid for r in run_log(report).tests.values() if r.outcome is not None}


@pytest.mark.parametrize(("name", "allocator", "cost"), [(LAZY, "lazy", 5.67),
                                                         (FALLBACK, "mixed", 5.20)])
def test_the_killed_catalogue_runs_passed_and_say_the_catalogue_was_interrupted(
        name: str, allocator: str, cost: float) -> None:
    """The pass is exact (200/200 in every step, gate proven, audit 22,014 digests with the
    gate's 8 only) on both kernel paths; the catalogue's test has no outcome, so the run is
    INCOMPLETE and its line says the delayed producer, the class it was in, never ran."""
    report = read(LMCACHE_H200 / f"{name}.json")
    service = _service(report)
    assert verdict(run_log(report)) == "INCOMPLETE"
    assert exact_pair(service, allocator) == (200, 200)
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.status, audit.detail["compared"], audit.detail["unmatched_state"]) == (
        "pass", 22014, 30)
    assert round(audit.detail["cost_us_per_token"], 2) == cost
    said = catalogue.line(service, allocator, _asked(report), _finished(report))
    assert said is not None and said.startswith(
        f"CATALOGUE {allocator}: interrupted after 8 of 9 classes (not run: "
        "delayed-producer); of those, 7 of 7 fault classes seen as expected"), said


@pytest.mark.parametrize("name", [LAZY, FALLBACK])
def test_each_fault_class_was_caught_by_what_can_see_it_on_both_kernel_paths(
        name: str) -> None:
    """Misrouted chunks, key collisions, lost writes and a bit flip in read KV are caught by
    the audit alone (every answer exact); the unread flip by nothing (the control); a state
    not restored or foreign by answers and audit; the hit accounting sees none. The L2
    load failure does not apply to the shared topology. Each cell's progress line is its
    record's message."""
    report = read(LMCACHE_H200 / f"{name}.json")
    cells = {str(c.key["step"]): c for c in _service(report) if c.kind == "fault-catalogue"}
    assert cells.pop("l2-load-failure").status == "info"
    found = {k: (c.detail["applications"], c.detail["faulted_requests"], c.detail["wrong"],
                 c.detail["mismatches"], c.detail["caught_by"]) for k, c in cells.items()}
    assert found == CELLS[name]
    assert {k: c.detail["compared"] for k, c in cells.items()} == COMPARED
    assert {c.status for c in cells.values()} == {"pass"}
    assert all(c.trials == 24 and c.passed == 24 - c.detail["wrong"] for c in cells.values())
    log = (LMCACHE_H200 / f"{name}.log").read_text()
    for step, cell in cells.items():
        assert f"catalogue {step}: {cell.message} (" in log, step
    rows = [line for line in catalogue.matrix(_service(report)) if line.startswith("| ")][1:]
    assert [[x.strip() for x in row.strip("|").split("|")][1:7] for row in rows][:7] == [
        [step, str(CELLS[name][step][0]),
         *("caught" if d in CELLS[name][step][4] else "missed"
           for d in ("answers", "audit", "hits")), "seen"] for step in CELLS[name]]


def test_on_the_fallbacks_lazy_pair_one_in_flight_leaves_the_fault_blocking_launches_removes_it(
        ) -> None:
    """The pass: 9 of 48 wrong after cross-replica hits, the gate VOID (0 of 4 answers
    copying from the zeroed chunk changed), the audit 6,840 of 7,424 digests mismatching.
    Two triage cells finished before the kill: one request in flight left 5 of 48 wrong and
    4,473 of 12,032 digests mismatching; CUDA_LAUNCH_BLOCKING=1 in the server and both
    replicas left 0 of 48 wrong and 0 of 4,992."""
    report = read(LMCACHE_H200 / f"{TRIAGE}.json")
    service = _service(report)
    assert verdict(run_log(report)) == "INCOMPLETE"
    assert report.data["environment"]["settings"]["triage"] is True
    gate = next(c for c in service if c.key.get("size") == "gate")
    assert (gate.status, gate.passed, gate.trials) == ("void", 0, 4)
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.status, audit.passed, audit.trials) == ("fail", 592, 7424)
    [line] = [x for x in verdicts(service) if x.startswith("VERDICT")]
    assert line.startswith("VERDICT lazy: 9 of 48 requests answered wrong after "
                           "cross-replica pool hits"), line
    assert line.endswith("the 39 exact answers prove nothing (GATE lazy: VOID)"), line
    cells = {str(c.key["step"]): c for c in service if c.key.get("size") == "triage"}
    assert {k: (c.status, c.passed, c.trials, c.detail["mismatches"], c.detail["compared"])
            for k, c in cells.items()} == {
        "one-in-flight": ("fail", 43, 48, 4473, 12032),
        "launch-blocking-all": ("pass", 48, 48, 0, 4992)}
    rows = [r for r in triage_table(service) if r.startswith("| lazy")]
    assert [[x.strip() for x in r.strip("|").split("|")][4:7] for r in rows] == [
        ["43/48", "4,473", "persists"], ["48/48", "0", "removed"]]
    log = (LMCACHE_H200 / f"{TRIAGE}.log").read_text()
    assert "triage one-in-flight: 5 of 48 wrong, 4,473 mismatching digests of 12,032" in log
    assert "triage launch-blocking-all: 0 of 48 wrong, 0 mismatching digests of 4,992" in log


@pytest.mark.parametrize(("name", "allocator", "seconds", "cost"), [
    (DELAY, "lazy", 128, 6.42), ("service-0.5.6-compiled-mixed-delay", "mixed", 99, 3.47)])
def test_a_delayed_producer_before_every_transfer_shows_no_race_on_the_compiled_kernels(
        name: str, allocator: str, seconds: int, cost: float) -> None:
    """The delayed producer's cell alone, on compiled lazy and (a later session, beside the
    fallback's triage) compiled mixed: 18 delays in 8 requests, 0 of 8 answers wrong and 0
    of 768 digests mismatching, the race probe on, so no race shows on the compiled
    kernels; each run, pass included (200/200, audit at 6.4 and 3.5 us an audited token), is
    a PASS of 429 tests."""
    report = read(LMCACHE_H200 / f"{name}.json")
    service = _service(report)
    log = run_log(report)
    assert verdict(log) == "PASS" and log.counts()["passed"] == 429
    assert exact_pair(service, allocator) == (200, 200)
    [cell] = [c for c in service if c.kind == "fault-catalogue"]
    assert (cell.key["step"], cell.status, cell.passed, cell.trials) == (
        "delayed-producer", "pass", 8, 8)
    assert (cell.detail["applications"], cell.detail["faulted_requests"],
            cell.detail["wrong"], cell.detail["mismatches"], cell.detail["compared"],
            cell.detail["race_probe"]) == (18, 8, 0, 0, 768, True)
    assert cell.message.startswith("delayed-producer: no race shows with a delayed producer "
                                   "before every KV transfer (18 applications in 8 requests; "
                                   "0 of 8 answers wrong, 0 mismatching digests (of 768")
    assert catalogue.line(service, allocator, _asked(report), _finished(report)) == (
        f"CATALOGUE {allocator}: 1 of 1 fault classes seen as expected ({seconds} s in its "
        "cells)")
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.status, audit.passed, round(audit.detail["cost_us_per_token"], 2)) == (
        "pass", 22014, cost)


def test_on_24_requests_the_fallbacks_lazy_fault_shows_and_the_same_two_cells_judge_it(
        ) -> None:
    """A third run of the fallback's lazy triage, 24 requests, stopped by its time limit in
    the third cell (CUDA_LAUNCH_BLOCKING=1 in the server only): the pass 5 of 24 wrong (B's
    receiver-local step too: its prefix cache held what the cross step loaded), one request
    in flight 4 of 24 wrong, blocking launches everywhere 0 of 24: what the 48-request run
    measured."""
    report = read(LMCACHE_H200 / "service-0.5.6-fallback-lazy-triage24-cut.json")
    service = _service(report)
    assert verdict(run_log(report)) == "INCOMPLETE"
    [line] = [x for x in verdicts(service) if x.startswith("VERDICT")]
    assert line.startswith("VERDICT lazy: 5 of 24 requests answered wrong after "
                           "cross-replica pool hits"), line
    assert "wrong where the replica's own caches served them: 3k receiver-local 5 of 24" \
        in line, line
    cells = {str(c.key["step"]): c for c in service if c.key.get("size") == "triage"}
    assert {k: (c.status, c.passed, c.trials) for k, c in cells.items()} == {
        "one-in-flight": ("fail", 20, 24), "launch-blocking-all": ("pass", 24, 24)}


def test_a_triage_cut_short_says_what_its_judged_cells_showed_and_names_no_class() -> None:
    """The 24-request triage recorded two cells and no verdict: the summary's TRIAGE line
    says INCOMPLETE, the cells not judged, which cell removed the fault and which left it
    (with their counts), and names no class of fault."""
    from tests.recorded import summary

    report = read(LMCACHE_H200 / "service-0.5.6-fallback-lazy-triage24-cut.json")
    [line] = [x for x in summary(report) if x.strip().startswith("TRIAGE")]
    assert line.strip() == (
        "TRIAGE lazy: INCOMPLETE (2 of 7 cells judged; not judged: launch-blocking-server, "
        "sync-transfers, current-stream, wait-producer, other-allocator): removed by "
        "CUDA_LAUNCH_BLOCKING=1 in the LMCache server and both replicas (0 of 24 wrong, 0 "
        "mismatching digests of 2,688); persists under one request in flight (no store "
        "overlapping a retrieve) (4 of 24 wrong, 2,244 mismatching digests of 7,422); no "
        "class of fault is named until every cell is judged")


def test_a_second_48_request_triage_and_the_fallbacks_mixed_delay_run_as_the_findings_say(
        ) -> None:
    """The second 48-request triage (its machine lost in the second cell's run): the pass 11
    of 48 wrong, one request in flight 5 of 48 (4,379 of 12,030 digests mismatching),
    blocking launches everywhere 0 of 48 (0 of 4,992). The fallback's mixed run for the
    delayed producer: the pass 200/200 in every step, 427 passed, and the catalogue's test
    without an outcome (its cell's cold step done, its cross step not, at the machine's
    loss)."""
    report = read(LMCACHE_H200 / "service-0.5.6-fallback-lazy-triage48-2-cut.json")
    service = _service(report)
    [line] = [x for x in verdicts(service) if x.startswith("VERDICT")]
    assert line.startswith("VERDICT lazy: 11 of 48 requests answered wrong"), line
    cells = {str(c.key["step"]): c for c in service if c.key.get("size") == "triage"}
    assert {k: (c.passed, c.trials, c.detail["mismatches"], c.detail["compared"])
            for k, c in cells.items()} == {"one-in-flight": (43, 48, 4379, 12030),
                                           "launch-blocking-all": (48, 48, 0, 4992)}
    delay = read(LMCACHE_H200 / "service-0.5.6-fallback-mixed-delay-cut.json")
    assert verdict(run_log(delay)) == "INCOMPLETE"
    assert exact_pair(_service(delay), "mixed") == (200, 200)
    assert run_log(delay).counts()["passed"] == 427
    assert not [c for c in _service(delay) if c.kind == "fault-catalogue"]


def test_on_the_fallback_the_delayed_producer_delays_every_layer_so_its_cell_needs_minutes(
        ) -> None:
    """The fallback's mixed run again (2026-12-03, a lane limit of 470 s): the pass exact,
    427 passed, and the delayed producer's cell cut again after its cold step. Its server
    shows why: on the torch fallback the delay hook also wraps the per-layer kernels and
    the D2H/H2D helpers (3,193 delayed calls in 19 transfers), so each 3,008-token store
    took 19.2 s, and the cell's eight prompts need minutes where the compiled path's cell
    (18 delayed calls) took 128 s in all: a lane for it needs about 15 minutes, not the
    470 s this one had."""
    from tests.h200_logs import delayed_calls, sections, transfer_seconds

    delay = read(LMCACHE_H200 / "service-0.5.6-fallback-mixed-delay-2-cut.json")
    assert verdict(run_log(delay)) == "INCOMPLETE"
    assert exact_pair(_service(delay), "mixed") == (200, 200)
    assert run_log(delay).counts()["passed"] == 427
    assert not [c for c in _service(delay) if c.kind == "fault-catalogue"]
    logs = sections(LMCACHE_H200 / "service-0.5.6-fallback-mixed-delay-2-cut-engine.log")
    server = logs["catalogue-delay0/lmcache-server-39893.log"]
    stores = transfer_seconds(server, "Stored")
    assert len(stores) == 6 and all(19.1 < s < 19.3 for s in stores), stores
    counts = delayed_calls(logs["catalogue-delay0/inject-delay.log (its lines counted by "
                                "target: uniq -c of the third field)"])
    assert sum(counts.values()) == 3193
    assert counts["lmcache.v1.multiprocess.object_group_transfer:"
                  "transfer_kv_per_object_group"] == 19


def test_that_runs_teardown_waited_for_its_requests_in_flight() -> None:
    """The same lane's SIGTERM (its start + 470 s) came 78 s before its server began to
    shut down: the server stored and retrieved on, for requests the interrupted step's
    thread pool waited on (processes/thread_pool.py now leaves such a pool at once;
    tests/test_thread_pool.py)."""
    from datetime import datetime, timezone

    from tests.h200_logs import sections

    logs = sections(LMCACHE_H200 / "service-0.5.6-fallback-mixed-delay-2-cut-engine.log")
    progress = logs["progress.txt (service-wave.sh; the lane's limit 470 s, timeout -s TERM)"]
    start = int(next(line.split()[0] for line in progress.splitlines()
                     if line.endswith("fb-mixed-delay start")))
    shutdown = re.search(r"\[([0-9-]+ [0-9:]+),\d+\] LMCache INFO: Shutting down LMCache HTTP",
                         logs["catalogue-delay0/lmcache-server-39893.log"])
    assert shutdown is not None
    began = datetime.strptime(shutdown[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    assert 75 <= began.timestamp() - (start + 470) <= 80


COMPLETE = "service-0.5.6-fallback-lazy-triage"
# cell -> (exact of 24, mismatching digests, compared, fault), in the order the cells ran
TRIAGE_CELLS = {"one-in-flight": (20, 2171, 7423, "persists"),
                "launch-blocking-all": (24, 0, 2688, "removed"),
                "launch-blocking-server": (24, 0, 2688, "removed"),
                "sync-transfers": (24, 0, 2688, "removed"),
                "current-stream": (24, 0, 2688, "removed"),
                "wait-producer": (24, 0, 2688, "removed"),
                "other-allocator": (24, 0, 2688, "removed")}


def test_the_fallbacks_lazy_triage_judged_every_cell_and_both_code_remedies_removed_the_fault(
        ) -> None:
    """The whole triage, all seven cells judged (a relaunched cell 71-84 s): one request in
    flight left 4 of 24 wrong; CUDA_LAUNCH_BLOCKING=1, the synchronize, the fallback's copy
    on the current stream, the copy waiting for its producer and the mixed allocator each
    left 0 of 24 and 0 of 2,688 digests. The TRIAGE line names a stream-ordering race and
    both code remedies; the run FAILs on the pass's own wrong answers."""
    report = read(LMCACHE_H200 / f"{COMPLETE}.json")
    service = _service(report)
    log = run_log(report)
    assert verdict(log) == "FAIL"
    assert (log.counts()["passed"], log.counts()["failed"]) == (41, 36)
    cells = {str(c.key["step"]): c for c in service if c.key.get("size") == "triage"}
    assert list(cells) == list(TRIAGE_CELLS)
    assert {k: (c.passed, c.detail["mismatches"], c.detail["compared"]) for k, c in
            cells.items()} == {k: v[:3] for k, v in TRIAGE_CELLS.items()}
    assert {k: c.detail["stream_remedy"] for k, c in cells.items()
            if c.detail["stream_remedy"]} == {"current-stream": "current-stream",
                                              "wait-producer": "wait-producer"}
    relaunched = [c.detail["wall_s"] for k, c in cells.items() if k != "one-in-flight"]
    assert min(relaunched) >= 71 and max(relaunched) <= 84, relaunched
    rows = [r for r in triage_table(service) if r.startswith("| lazy")]
    assert [[x.strip() for x in r.strip("|").split("|")][1] for r in rows] == list(cells)
    assert [[x.strip() for x in r.strip("|").split("|")][6] for r in rows] == [
        v[3] for v in TRIAGE_CELLS.values()]


def test_the_triage_and_verdict_lines_of_the_complete_triage_are_what_its_terminal_said(
        ) -> None:
    """The summary rendered from the report says, word for word, the TRIAGE and VERDICT
    lines the run printed: the two code remedies proven by their cells, CUDA_LAUNCH_BLOCKING
    in the server and the mixed allocator too; the synchronize a suggestion (a control,
    not a change one could ship)."""
    from tests.recorded import summary

    report = read(LMCACHE_H200 / f"{COMPLETE}.json")
    printed = (LMCACHE_H200 / f"{COMPLETE}.log").read_text().splitlines()
    rendered = [x.strip() for x in summary(report)]
    for word in ("TRIAGE lazy:", "VERDICT lazy:"):
        [said] = [x.strip() for x in printed if x.strip().startswith(word)]
        assert said in rendered, word
    [triage] = [x for x in rendered if x.startswith("TRIAGE lazy:")]
    assert triage.startswith("TRIAGE lazy: stream-ordering race (removed by "), triage
    assert ("code remedies: current-stream removed it (0 of 24 wrong, 0 mismatching digests "
            "of 2,688); wait-producer removed it (0 of 24 wrong, 0 mismatching digests of "
            "2,688) (the pass: 2 of 24 3k cross-replica answers wrong, 1,931 mismatching "
            "digests)") in triage, triage
    [line] = [x for x in verdicts(_service(report)) if x.startswith("VERDICT")]
    for cell in ("launch-blocking-server", "current-stream", "wait-producer",
                 "other-allocator"):
        assert f"(proven by the triage cell {cell}: 24/24 exact, 0 mismatching digests)" \
            in line, cell
    assert ("suggestion (not a proven remedy): make LMCache's KV transfers wait for the "
            "streams that produce and read their buffers (a code change) (the triage cell "
            "sync-transfers removed the fault; as a remedy untested)") in line, line


def test_each_code_remedy_ran_in_its_cells_server_and_what_its_transfers_took() -> None:
    """Each code remedy's server printed its hook's lines (the wrapped function named), and
    the cells' servers logged their stores and retrieves of whole 3,008-token prompts: the
    medians the findings page gives (one cell each; the four after the compiled lane ended
    ran alone on the GPU)."""
    from statistics import median

    from tests.h200_logs import sections, transfer_seconds

    logs = sections(LMCACHE_H200 / f"{COMPLETE}-servers.log")
    by_cell = {k.split("/")[0]: v for k, v in logs.items() if "-server-" in k}
    for remedy in ("current-stream", "wait-producer"):
        text = by_cell[f"triage-{remedy}0"]
        assert (f"sharedkv-remedy: {remedy} remedy in lmcache.v1.platform.torch_ops."
                "mem_kernels:lmcache_memcpy_async") in text, remedy

    def medians(text: str) -> tuple[float, ...]:
        return tuple(round(median(transfer_seconds(text, verb)), 3)
                     for verb in ("Stored", "Retrieved"))

    assert {k: medians(v) for k, v in by_cell.items()} == {
        "replicas-vllm-lazy-00": (0.131, 0.056),
        "triage-launch-blocking-all0": (0.152, 0.121),
        "triage-launch-blocking-server0": (0.110, 0.145),
        "triage-sync-transfers0": (0.207, 0.095),
        "triage-current-stream0": (0.128, 0.070),
        "triage-wait-producer0": (0.096, 0.052),
        "triage-other-allocator0": (0.107, 0.061)}
    progress = logs["progress.txt (service-wave.sh, plans/triage-beside-mixed-delay.sh)"]
    assert progress.splitlines()[-2:] == ["1796303888 fb-lazy-triage rc=1 wall=794",
                                          "1796303888 alldone"]


def test_on_the_fallbacks_mixed_pair_a_tenth_of_the_delay_shows_no_race() -> None:
    """The fallback's mixed pair in what the session had left: the catalogue's test alone
    (its pass the gate and 3k at 24 requests) with ``--sharedkv-delay-cycles 10000000``, a
    tenth of the default. The cell: 4,353 delays in 8 requests (about 256 a transfer: every
    per-layer kernel and copy helper), 0 of 8 answers wrong, 0 of 768 digests mismatching:
    no race shows. Each 3,008-token store took 2.0 s (19.2 s at the default)."""
    from statistics import median

    from tests.h200_logs import delayed_calls, sections, transfer_seconds

    name = "service-0.5.6-fallback-mixed-delay-short"
    report = read(LMCACHE_H200 / f"{name}.json")
    assert report.data["environment"]["settings"]["delay_cycles"] == 10_000_000
    assert "NOT loaded" in (LMCACHE_H200 / f"{name}.log").read_text()
    log = run_log(report)
    assert verdict(log) == "PASS" and log.counts()["passed"] == 1
    service = _service(report)
    [cell] = [c for c in service if c.kind == "fault-catalogue"]
    assert (cell.key["step"], cell.key["allocator"], cell.status, cell.passed, cell.trials) \
        == ("delayed-producer", "mixed", "pass", 8, 8)
    assert (cell.detail["applications"], cell.detail["faulted_requests"],
            cell.detail["wrong"], cell.detail["mismatches"], cell.detail["compared"]) == (
        4353, 8, 0, 0, 768)
    assert catalogue.line(service, "mixed", _asked(report), _finished(report)) == (
        "CATALOGUE mixed: 1 of 1 fault classes seen as expected (96 s in its cells)")
    logs = sections(LMCACHE_H200 / f"{name}-engine.log")
    server = logs["catalogue-delay0/lmcache-server-47253.log (its sharedkv lines, stores and "
                  "retrieves)"]
    assert "fault-sensitivity mode, 10000000 cycles before each KV transfer" in server
    stores = transfer_seconds(server, "Stored")
    assert len(stores) == 7 and round(median(stores), 1) == 2.0, stores
    counts = delayed_calls(logs["catalogue-delay0/inject-delay.log (its lines counted by role "
                                "and target)"])
    assert sum(counts.values()) == 4353
    assert counts["lmcache.v1.multiprocess.object_group_transfer:"
                  "transfer_kv_per_object_group"] == 17
