"""Two H200 runs of 2026-12-02 that a time limit stopped (fixtures/lmcache/h200/*-cut.*),
read as the product reads a report: what finished is in them, and the run says INCOMPLETE.

``service-0.5.6-compiled-mixed-catalogue-cut``: LMCache 0.5.6 compiled, mixed, copy model,
3k, no audit option (on by default), ``--sharedkv-fault-catalogue all``; the pass finished,
then seven of the catalogue's cells, before SIGTERM stopped the delayed producer's pair.
``service-0.5.6-fallback-lazy-triage3-cut``: the torch fallback, lazy, 64 measured requests
(``SHAREDKV_SERVICE_MEASURED``), ``--sharedkv-triage``; six cells finished, then SIGTERM.
The cells' outcomes of these runs are in their progress logs only (the records were
written when the whole catalogue or triage ended), so the cells are read from the logs."""

from __future__ import annotations

import re

from pytest_sharedkv.report.terminal import verdict
from pytest_sharedkv.service.baseline import exact_pair
from tests.recorded import LMCACHE_H200, checks, read, run_log

CATALOGUE = "service-0.5.6-compiled-mixed-catalogue-cut"
TRIAGE = "service-0.5.6-fallback-lazy-triage3-cut"


def _cells(name: str, what: str) -> dict[str, str]:
    """The progress log's judged cells: class or control -> its line's verdict."""
    text = (LMCACHE_H200 / f"{name}.log").read_text()
    found = re.findall(rf"\] {what} ([a-z-]+): (.*)", text)
    return {cell: line for cell, line in found
            if not line.startswith(("starting", "released"))}


def test_the_default_run_audits_every_cross_replica_request_and_says_what_it_cost() -> None:
    """No audit option was given: the audit ran (21,246 digests, the gate's 8 mismatching,
    30 recurrent-state loads not judged) at 5.2 us an audited token, with 200/200 exact in
    every step, and the run is INCOMPLETE, not PASS, because the catalogue had no outcome."""
    report = read(LMCACHE_H200 / f"{CATALOGUE}.json")
    service = checks(report, "service_regression")
    assert verdict(run_log(report)) == "INCOMPLETE"
    assert exact_pair(service, "mixed") == (200, 200)
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.kind, audit.status, audit.detail["compared"]) == (
        "audit-mismatch", "pass", 21246)
    assert (audit.detail["unmatched_state"], round(audit.detail["cost_us_per_token"], 1)) == (
        30, 5.2)
    log = (LMCACHE_H200 / f"{CATALOGUE}.log").read_text()
    assert "--sharedkv-kv-audit" not in log.split("collected")[0]


def test_seven_fault_classes_were_applied_on_the_compiled_stack_and_each_was_seen_as_it_should(
        ) -> None:
    """Every class caught where it should be, and only by what can see it: a misrouted
    chunk, a key collision, a lost write and a bit flip in read KV by the audit alone (every
    answer exact), the unread flip by nothing (the control), a state not restored or
    foreign by answers and audit."""
    cells = _cells(CATALOGUE, "catalogue")
    assert list(cells) == ["misrouted", "key-collision", "lost-write", "bit-flip",
                           "bit-flip-unread", "state-unrestored", "state-foreign"]
    seen = {name: re.match(rf"{name}: (caught by nothing|caught by [a-z]+(?:, [a-z]+)*)", line)
            for name, line in cells.items()}
    assert {k: m.group(1) if m else None for k, m in seen.items()} == {
        "misrouted": "caught by audit", "key-collision": "caught by audit",
        "lost-write": "caught by audit", "bit-flip": "caught by audit",
        "bit-flip-unread": "caught by nothing", "state-unrestored": "caught by answers, audit",
        "state-foreign": "caught by answers, audit"}
    assert "0 of 24 answers wrong" in cells["misrouted"]
    assert "12 of 24 answers wrong" in cells["state-unrestored"]


def test_on_the_fallback_each_stream_ordering_cell_removed_the_fault_one_request_did_not(
        ) -> None:
    """The pass: 8 of 64 wrong after cross-replica hits, 3,369 mismatching digests, and the
    gate VOID (3 of 4 answers copying from the zeroed chunk changed; 4,830 of 8,191
    digests matched). The triage's cells:
    both code remedies (the fallback's copy on the current stream; waiting for the producing
    stream) and the three controls that order the server's streams left 0 of 64 wrong and 0
    mismatching digests; one request in flight left 4 of 64 wrong."""
    report = read(LMCACHE_H200 / f"{TRIAGE}.json")
    service = checks(report, "service_regression")
    assert verdict(run_log(report)) == "INCOMPLETE"
    gate = next(c for c in service if c.key.get("size") == "gate")
    assert (gate.status, gate.passed, gate.trials) == ("void", 3, 4)
    audit = next(c for c in service if c.key.get("size") == "audit")
    assert (audit.status, audit.passed, audit.trials) == ("fail", 4830, 8191)
    cells = _cells(TRIAGE, "triage")
    assert {k: v.split(" (")[0] for k, v in cells.items()} == {
        "one-in-flight": "4 of 64 wrong, 5,315 mismatching digests of 14,335",
        "launch-blocking-all": "0 of 64 wrong, 0 mismatching digests of 6,528",
        "launch-blocking-server": "0 of 64 wrong, 0 mismatching digests of 6,528",
        "sync-transfers": "0 of 64 wrong, 0 mismatching digests of 6,528",
        "current-stream": "0 of 64 wrong, 0 mismatching digests of 6,528",
        "wait-producer": "0 of 64 wrong, 0 mismatching digests of 6,528"}
