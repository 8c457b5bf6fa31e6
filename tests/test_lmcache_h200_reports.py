"""The recorded GPU runs (fixtures/lmcache/h200/, fixtures/perf/h200/) read as the product
reads a report: compare's reader takes every one, its records are the plugin's own, and
the summary the terminal renders from it now gives the tables, tier counts and verdict the
GPU run printed. A reader, a renderer or a report format that misreads a real run fails
here, not only an edited file. The tests below hold what the product computes from the
H200 runs on LMCache 0.5.6's compiled path (cuda_ops built against the host's torch 2.11).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_sharedkv.cli.compare.correctness import findings
from pytest_sharedkv.ordering.summary import sensitivity_line, verdict_lines
from pytest_sharedkv.report.terminal import verdict, verdict_line
from pytest_sharedkv.service.baseline import exact_pair
from pytest_sharedkv.service.summary import verdicts
from tests.recorded import LMCACHE_H200, PERF_H200, checks, read, records, run_log, summary

RECORDED = sorted([*LMCACHE_H200.glob("*.json"), *PERF_H200.glob("*.json")])
# The tables of recorded reports that the summary renders otherwise now, by the first
# column of their header, and why; the report's other tables and lines are still compared.
RENDERED_SINCE = {
    # written before records had a status: their xfail cells read back as passes of 0/0
    # (compare's legacy rule reads them from the text), and the table shows n/a
    "ordering-packed_page-0.5.6-compiled-rerun.json": ("layout",),
    # two block pairs give no interval: said once under each ratio table since, rows show -
    "blocks1.json": ("size | step | ratio", "within | ratio"),
    "blocks2.json": ("size | step | ratio", "within | ratio"),
}
TIER_COUNTS = re.compile(r"\[\w+\] tests: ")
# Runs killed by their time limit before pytest's session ended: their logs stop in the
# progress lines, with no summary to compare (the report, written as cells finished, is
# still read by every other test here).
KILLED = frozenset({"service-0.5.6-compiled-lazy-catalogue-cut.json",
                    "service-0.5.6-fallback-mixed-catalogue-cut.json",
                    "service-0.5.6-fallback-lazy-triage48-cut.json",
                    "native-offloading-vllm-0.26.0-2-cut.json",
                    "native-simple-vllm-0.26.0-2-cut.json",
                    "service-0.5.6-fallback-lazy-triage48-2-cut.json"})


def _logged(path: Path) -> list[str]:
    """The sharedkv summary the run printed (its log beside the report), up to its verdict
    line or pytest's own lines after it."""
    text = path.with_suffix(".log").read_text().splitlines()
    start = next(i for i, line in enumerate(text) if "sharedkv summary" in line) + 1
    end = next((i for i, line in enumerate(text[start:], start)
                if line.startswith(("sharedkv: ", "JSON report: ", "=====", "plots: "))),
               len(text))
    return text[start:end + 1 if text[end:end + 1] and text[end].startswith("sharedkv: ")
                else end]


def _tables(lines: list[str]) -> dict[str, list[list[str]]]:
    """Each Markdown table by its header (cells stripped): its rows' cells."""
    tables: dict[str, list[list[str]]] = {}
    rows: list[list[str]] = []
    for line in [*lines, ""]:
        if line.strip().startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables[" | ".join(rows[0])] = rows[2:]
            rows = []
    return tables


@pytest.mark.parametrize("path", [p for p in RECORDED if p.with_suffix(".log").exists()
                                  and p.name not in KILLED], ids=lambda p: p.name)
def test_the_summary_rendered_from_a_recorded_report_is_what_its_run_printed(
        path: Path) -> None:
    """Every table whose columns are those the run printed holds the same rows, every
    tier's counts line is the same, and where the run printed its verdict line, so is it."""
    report = read(path)
    rendered, logged = summary(report), _logged(path)
    mine, theirs = _tables(rendered), _tables(logged)
    since = RENDERED_SINCE.get(path.name, ())
    compared = [h for h in theirs if h in mine and not h.startswith(since)]
    assert compared or not theirs, f"no table of {path.name} kept its columns: {list(theirs)}"
    for header in compared:
        assert mine[header] == theirs[header], header
    assert [x for x in rendered if TIER_COUNTS.match(x)] == [
        x for x in logged if TIER_COUNTS.match(x)]
    printed = [x for x in logged if x.startswith("sharedkv: ")]
    if printed:
        assert [verdict_line(run_log(report))] == printed


def test_the_killed_runs_printed_no_summary() -> None:
    """Each run left out of the comparison above printed none (a log trimmed by mistake
    would hide its summary from the comparison)."""
    for name in sorted(KILLED):
        log = (LMCACHE_H200 / name).with_suffix(".log").read_text()
        assert "[sharedkv service" in log and "sharedkv summary" not in log, name


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_every_recorded_report_reads_as_the_plugin_wrote_it(path: Path) -> None:
    """compare's reader takes it (schema, perf analysed), each record's kind and status
    are words this plugin knows, and the summary renders with a verdict."""
    report = read(path)
    bundle = records(report)
    assert len(bundle.checks) == len(report.data["checks"])
    assert verdict(run_log(report)) in ("PASS", "FAIL", "VOID", "INCOMPLETE")


@pytest.mark.parametrize(("name", "allocators"), [
    ("service-0.5.6-compiled.json", ("lazy", "mixed")),
    ("service-0.5.6-compiled-lazy-repeat.json", ("lazy",)),
])
def test_compiled_path_is_exact_for_both_allocators(name: str,
                                                    allocators: tuple[str, ...]) -> None:
    """Each allocator's pair is exact as the product judges one (every step, gate and audit
    record held: 200/200 cross-replica answers), compare finds nothing wrong in the run,
    and the summary's verdict is PASS."""
    report = read(LMCACHE_H200 / name)
    service = checks(report, "service_regression")
    assert findings(report) == []
    assert verdict(run_log(report)) == "PASS"
    for allocator in allocators:
        assert exact_pair(service, allocator) == (200, 200)
        assert f"VERDICT {allocator}: 200/200 requests exact in every step (cold, local, " \
            "cross-replica, receiver-local), hits as expected; sessions 48/48 turns, " \
            "protocol 15/15" in verdicts(service)


def test_the_audit_passed_over_every_digest_of_both_pairs() -> None:
    """Both pairs' KV audits compared 21,246 chunk-group-layer digests and kept no mismatch
    as a fault (the gate's zeroed chunk in its 8 control requests is its positive
    control, split off before the record): each record is a pass of 21,246, and the pair
    with it is exact."""
    service = checks(read(LMCACHE_H200 / "service-0.5.6-compiled.json"), "service_regression")
    audits = {c.key["allocator"]: c for c in service if c.key.get("size") == "audit"}
    assert set(audits) == {"lazy", "mixed"}
    for allocator, audit in audits.items():
        assert (audit.passed, audit.trials, audit.status) == (21246, 21246, "pass")
        assert audit.detail["compared"] == 21246 and audit.detail["mismatches"] == []
        assert exact_pair(service, allocator) is not None  # the audit is one of its records


def test_ordering_on_the_compiled_path() -> None:
    """The probe saw stale bytes through the raw copy in every delayed check; what LMCache
    binds (device ops -> cuda_ops) held them all; its torch fallback, called directly,
    did not."""
    ordering = checks(read(LMCACHE_H200 / "ordering-0.5.6-compiled.json"), "ordering")
    sensitive, _ = sensitivity_line(ordering)
    assert sensitive
    lines = verdict_lines(ordering, sensitive)
    assert ("VERDICT lmcache-device-ops [under-test]: stream-ordered (60/60 delayed and 60/60 "
            "undelayed checks held)") in lines
    assert ("VERDICT lmcache-fallback [under-test]: NOT stream-ordered: 60/60 delayed checks "
            "saw stale bytes") in lines
