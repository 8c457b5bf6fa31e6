"""The findings pages' figures that issue 51 found overreaching their runs, each read from
the committed report it rests on: the 12-01 pages' audit count outside the gate, the 11-30
page's pool ratios at both sizes, the L2 write cell's hits, the 12-01 triage's code-remedy
cells since run, and the hosts page's cause said one way (a hypothesis)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.recorded import LMCACHE_H200, PERF_H200, ROOT, checks, read

FINDINGS = ROOT / "docs" / "findings"


def _page(name: str) -> str:
    return " ".join((FINDINGS / name).read_text().split())  # one line: wrapping aside


def _n(value: int) -> str:
    return f"{value:,}"


def test_the_audit_count_outside_the_gate_is_the_checks_and_the_gate_holds_the_rest() -> None:
    report = read(LMCACHE_H200 / "service-0.5.6-fallback-lazy-triage2.json")
    [audit] = [c for c in checks(report, "service_regression")
               if c.key.get("size") == "audit" and c.key.get("step") == "kv digests"]
    outside = audit.trials - audit.passed
    notes = [n["text"] for n in report.data["notes"]]
    [total] = [int(m.group(1)) for t in notes
               if (m := re.search(r"KV AUDIT lazy: .*?: (\d+) mismatching digests", t))]
    [gate] = [int(m.group(1)) for t in notes
              if (m := re.search(r"zeroed chunk \d+ showed as a mismatch in (\d+) of", t))]
    assert (outside, total, gate) == (10151, 10159, 8) and outside + gate == total
    releases = _page("2026-12-01-h200-compiled-and-0.5.3.md")
    assert f"| {_n(outside)} ({_n(total)} with the gate's {gate}), in 214 of 221 requests |" \
        in releases
    assert "| 10,159, in" not in releases
    triage = _page("2026-12-01-triage.md")
    assert (f"found {_n(total)} mismatching in 214 of them ({_n(outside)} outside the "
            f"sensitivity gate's zeroed chunk, whose {gate} control requests") in triage


def test_the_triage_page_says_its_code_remedy_cells_have_run_with_their_counts() -> None:
    report = read(LMCACHE_H200 / "service-0.5.6-fallback-lazy-triage.json")
    cells = {c.key["step"]: c for c in checks(report, "service_regression")
             if c.key.get("size") == "triage"}
    remedies = [cells[name] for name in ("current-stream", "wait-producer")]
    assert {(c.passed, c.trials, c.detail["mismatches"], c.detail["compared"],
             c.detail["removed"]) for c in remedies} == {(24, 24, 0, 2688, True)}
    triage = _page("2026-12-01-triage.md")
    assert "No run has filled these cells yet" not in triage
    assert ("filled both, each removing the fault (24/24 exact, 0 of 2,688 digests "
            "mismatching") in triage


def test_the_pool_paid_off_at_both_sizes_of_the_11_30_screening() -> None:
    from pytest_sharedkv.perf.observations import from_json
    from pytest_sharedkv.perf.statistics import analyse

    data = json.loads((PERF_H200 / "blocks2.json").read_text())["perf"]
    ratios = {r.size: r for r in analyse(from_json(data)).ratios if r.step == "cross"}

    def said(size: str) -> tuple[str, str]:
        pairs = " and ".join(f"{v:.2f}x" for _, v in ratios[size].per_pair)
        return f"{ratios[size].median:.2f}x at {size} (", pairs

    page = _page("2026-11-30-h200-torch-fallback.md")
    assert all(v < 1 for r in ratios.values() for _, v in r.per_pair)  # ON faster, each pair
    assert "paid off only at 8k" not in page
    assert "The pool paid off at both sizes, less at 32k." in page
    for size in ("8k", "32k"):
        head, pairs = said(size)
        assert head in page and pairs in page, (head, pairs)


def test_the_l2_write_cell_says_which_later_answers_hit_the_l2() -> None:
    report = read(LMCACHE_H200 / "hosts-0.5.6-compiled-l2-write.json")
    [cell] = [c for c in checks(report, "service_regression")
              if c.key.get("step") == "l2 write failure"]
    cached: dict[str, Any] = cell.detail["cached_by_request"]
    hit = [v for v in cached.values() if v]
    whole = [v for v in hit if v == max(hit)]
    page = _page("2026-12-03-h200-stacks-catalogue.md")
    assert (f"then {cell.passed}/{cell.trials} later answers exact, no hit past what the L2 "
            f"held, the audit clean; of those {len(cached)}, {len(hit)} hit the L2 (five "
            f"prompts held whole, {_n(max(hit))} tokens each; one in part, "
            f"{_n(min(hit))}) and {len(cached) - len(hit)} hit nothing") in page
    assert len(whole) == 5 and len(hit) - len(whole) == 1


def test_the_hosts_page_calls_its_cause_a_hypothesis_throughout() -> None:
    page = _page("2026-12-02-hosts.md")
    assert not re.search(r"confirm|unverified|not yet verified", page)
    assert "## The fault cell's wrong answer: a hypothesis " in page
    assert "its cause is a hypothesis, the next section's" in page
