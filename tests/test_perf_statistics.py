"""The numbers of a screening: cell medians over every observation, the paired ratio per
block pair, a seeded percentile bootstrap over block pairs only from three pairs on, and
session wall times paired per block pair; the tables carry them with their verdicts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_sharedkv.perf.observations import Observation, PerfRun, SessionObservation, from_json
from pytest_sharedkv.perf.pairing import pair_observations
from pytest_sharedkv.perf.statistics import (
    analyse,
    bootstrap_interval,
    cells,
    no_interval,
    paired_ratios,
    session_ratios,
)
from pytest_sharedkv.perf.tables import report_lines
from tests.perf_arms import native_last, with_native_pair

SCREENING = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "screening.json"


def obs(arm: str, block: int, request: str, ttft_s: float, **changes: object) -> Observation:
    base = Observation(arm=arm, block=block, pair=block // 2, size="8k", step="cross",
                       request=request, payload_sha256=f"sha-{request}", replica="B",
                       prompt_tokens=8175, output_tokens=16, ttft_s=ttft_s,
                       decode_tok_s=50.0, e2e_s=ttft_s + 0.3)
    return replace(base, **changes)  # type: ignore[arg-type]


def screening(pairs: int, on: list[list[float]], off: float = 1.0) -> list[Observation]:
    """PAIRS block pairs (OFF then ON); ON[p] holds the ON TTFTs of pair p's requests."""
    data = []
    for p in range(pairs):
        for i, ttft in enumerate(on[p]):
            data += [obs("OFF", 2 * p, f"r{i}", off), obs("ON", 2 * p + 1, f"r{i}", ttft)]
    return data


@pytest.fixture(scope="module")
def fixture_run() -> PerfRun:
    return from_json(json.loads(SCREENING.read_text())["perf"])


def test_a_cell_is_every_measured_observation() -> None:
    data = [obs("ON", 1, "a", 1.0), obs("ON", 1, "b", 3.0, decode_tok_s=None),
            obs("ON", 3, "a", 2.0, pair=1, decode_tok_s=40.0),
            obs("ON", 1, "w", 100.0, warmup=True)]
    (cell,) = cells(data)
    assert (cell.size, cell.arm, cell.step, cell.n, cell.block_pairs) == ("8k", "ON", "cross",
                                                                          3, 2)
    assert cell.median_ttft_s == 2.0
    assert cell.median_decode_tok_s == 45.0  # None (one output token) left out


def test_the_ratio_of_a_pair_is_the_median_over_its_requests() -> None:
    data = screening(3, [[0.2, 0.3, 0.9], [0.4, 0.5, 0.6], [0.1, 0.1, 0.8]])
    (ratio,) = paired_ratios(pair_observations(data).check())
    assert ratio.per_pair == ((0, 0.3), (1, 0.5), (2, 0.1))
    assert ratio.median == 0.3 and ratio.block_pairs == 3 and ratio.requests == 9
    assert ratio.interval is not None
    assert ratio.interval.low <= ratio.median <= ratio.interval.high


def test_the_bootstrap_is_seeded_and_resamples_block_pairs() -> None:
    values = [0.31, 0.28, 0.35, 0.30, 0.27, 0.40]
    first = bootstrap_interval(values, seed=7)
    assert first is not None and first == bootstrap_interval(values, seed=7)
    assert (first.confidence, first.resamples, first.seed) == (0.95, 2000, 7)
    assert min(values) <= first.low <= first.high <= max(values)
    wider = bootstrap_interval(values, confidence=0.99, seed=7)
    assert wider is not None and wider.low <= first.low and wider.high >= first.high
    assert str(first).startswith("95% interval ")


def test_two_block_pairs_give_no_interval_and_say_why() -> None:
    assert bootstrap_interval([0.3, 0.4]) is None
    data = screening(2, [[0.2, 0.3], [0.4, 0.5]])
    (ratio,) = paired_ratios(pair_observations(data).check())
    assert ratio.interval is None
    assert ratio.spread == "no interval: 2 block pairs (an interval needs >= 3)"
    assert no_interval(1) == "no interval: 1 block pairs (an interval needs >= 3)"


def test_sessions_are_paired_per_block_pair() -> None:
    def session(arm: str, block: int, placement: str, wall: float) -> SessionObservation:
        return SessionObservation(arm, block, block // 2, "s0", placement, 6, wall, "sha")

    data = [session("OFF", 0, "fixed", 1.0), session("OFF", 0, "alternating", 3.0),
            session("ON", 1, "fixed", 1.0), session("ON", 1, "alternating", 1.1),
            session("ON", 2, "fixed", 2.0), session("ON", 2, "alternating", 2.0),
            session("OFF", 3, "fixed", 2.0), session("OFF", 3, "alternating", 4.0)]
    found = {(r.subject, r.ratio): r for r in session_ratios(data)}
    assert found[("OFF", "alternating/fixed")].per_pair == ((0, 3.0), (1, 2.0))
    assert found[("ON", "alternating/fixed")].median == pytest.approx(1.05)
    assert found[("alternating", "ON/OFF")].per_pair == ((0, 1.1 / 3.0), (1, 0.5))
    assert found[("fixed", "ON/OFF")].spread.startswith("no interval: 2 block pairs")


def test_the_fixture_screening_analysed(fixture_run: PerfRun) -> None:
    analysis = analyse(fixture_run)
    assert analysis.pairing.ok
    assert len(analysis.cells) == 3 * 2 * 4
    assert all(c.n == 6 and c.block_pairs == 3 for c in analysis.cells)
    cross = [r for r in analysis.ratios if r.step == "cross"]
    assert [r.size for r in cross] == ["8k", "32k", "128k"]
    assert all(r.interval is not None and r.interval.high < 1 for r in cross)
    assert analyse(fixture_run).ratios == analysis.ratios  # seeded: the same every time
    text = "\n".join(report_lines(analysis))
    assert "| 128k | ON  |" in text and "(n=6, 3 pairs)" in text
    verdicts = [line for line in text.splitlines() if line.startswith("VERDICT")]
    assert [v.split(":")[0] for v in verdicts] == ["VERDICT perf", "VERDICT floor",
                                                   "VERDICT hits", "VERDICT sessions"]
    assert "faster" in verdicts[0] and "above the physical floor" in verdicts[1]
    assert "all 18 ON cross-replica requests were full pool hits" in verdicts[2]


def test_refused_pairs_leave_the_screening_unjudged(fixture_run: PerfRun) -> None:
    broken = replace(fixture_run, observations=[
        replace(o, prompt_tokens=o.prompt_tokens + 1) if (o.block, o.request, o.step) ==
        (1, "8k-0", "cold") else o for o in fixture_run.observations])
    text = "\n".join(report_lines(analyse(broken)))
    assert "VERDICT perf: NOT JUDGED: 2 observations refused pairing: request 8k-0" in text


def test_a_cross_ttft_below_the_floor_is_invalid(fixture_run: PerfRun) -> None:
    fast = replace(fixture_run, observations=[
        replace(o, ttft_s=0.05) if (o.block, o.request, o.step) == (1, "128k-0", "cross")
        else o for o in fixture_run.observations])
    text = "\n".join(report_lines(analyse(fast)))
    assert "VERDICT floor: INVALID: 1 of 36 cross-replica TTFTs are below the physical floor" \
        in text
    assert "request 128k-0, block 1, arm ON" in text
    assert "INVALID (1 of 6 below the floor)" in text
    no_floor = replace(fixture_run, floor=None)
    assert "NOTE floor: not measured in this run" in "\n".join(report_lines(analyse(no_floor)))


def test_a_treatment_in_some_pairs_is_judged_on_those_pairs(fixture_run: PerfRun) -> None:
    """ON in two block pairs, NATIVE in one: each ratio uses its own pairs, the table says
    how many each has, and a partial ON hit leaves NATIVE's ratio of that size judged as
    its pairs allow (not NOT JUDGED for ON's sake)."""
    run = native_last(fixture_run)
    analysis = analyse(run)
    assert analysis.pairing.ok, analysis.pairing.refusals
    assert analysis.arm_pairs == {"OFF": 3, "ON": 2, "NATIVE": 1}
    pairs = {(r.size, r.step, r.arms): r.block_pairs for r in analysis.ratios}
    assert pairs[("8k", "cross", "ON/OFF")] == 2 and pairs[("8k", "cross", "NATIVE/OFF")] == 1
    sessions = {(r.subject, r.ratio): r.block_pairs for r in analysis.session_ratios}
    assert sessions[("fixed", "NATIVE/OFF")] == 1 and sessions[("fixed", "ON/OFF")] == 2
    lines = report_lines(analysis)
    assert "block pairs per treatment (its ratios use the pairs that hold it): ON: 2 block " \
        "pairs: no interval, NATIVE: 1 block pair: no interval (an interval needs >= 3)" \
        in lines
    partial = replace(run, observations=[
        replace(o, cached_tokens=0) if (o.arm, o.step, o.size, o.request) ==
        ("ON", "cross", "8k", "8k-0") else o for o in run.observations])
    (verdict,) = [line for line in report_lines(analyse(partial))
                  if line.startswith("VERDICT perf")]
    assert "8k ON/OFF" in verdict and "NOT JUDGED (2 ON requests were partial" in verdict
    native = verdict.split("8k NATIVE/OFF ")[1].split(";")[0]
    assert "no interval: 1 block pairs" in native and "NOT JUDGED" not in native


def test_three_pairs_of_a_treatment_give_its_interval_beside_one_without(
        fixture_run: PerfRun) -> None:
    """A merge of three OFF-ON pairs and one OFF-NATIVE pair: ON's ratios have intervals,
    NATIVE's none, and the line says which."""
    extra = with_native_pair(fixture_run)
    analysis = analyse(extra)
    assert analysis.pairing.ok, analysis.pairing.refusals
    assert all((r.interval is not None) == (r.treatment == "ON") for r in analysis.ratios)
    assert "block pairs per treatment (its ratios use the pairs that hold it): ON: 3 block " \
        "pairs, NATIVE: 1 block pair: no interval (an interval needs >= 3)" \
        in report_lines(analysis)


def repeated(run: PerfRun, times: int) -> PerfRun:
    """RUN's first block pair (OFF-ON) and TIMES - 1 copies of it numbered on: what one run
    merged with itself would give."""
    blocks = run.blocks[:2] * times
    return replace(run, blocks=blocks, block_pairs=[b // 2 for b in range(len(blocks))],
                   observations=[replace(o, block=o.block + 2 * k, pair=k) for k in range(times)
                                 for o in run.observations if o.block < 2],
                   sessions=[replace(s, block=s.block + 2 * k, pair=k) for k in range(times)
                             for s in run.sessions if s.block < 2])


def test_a_pair_that_repeats_another_counts_once(fixture_run: PerfRun) -> None:
    """One block pair given three times is one independent pair: no interval (an interval
    of width zero is no interval), nothing judged, and the text says which pairs repeat."""
    analysis = analyse(repeated(fixture_run, 3))
    assert analysis.pairing.ok
    assert {r.block_pairs for r in analysis.ratios} == {1}
    assert all(r.interval is None and r.repeats == ((1, 0), (2, 0)) for r in analysis.ratios)
    assert {r.block_pairs for r in analysis.session_ratios} == {1}
    assert all(r.interval is None for r in analysis.session_ratios)
    assert all(len(c.per_pair_ttft_s) == c.block_pairs == 1 for c in analysis.cells)
    assert all(len(c.per_pair_wall_s) == c.block_pairs == 1 for c in analysis.session_cells)
    (verdict,) = [line for line in report_lines(analysis) if line.startswith("VERDICT perf")]
    assert ("8k ON/OFF 0.20x, no interval: 1 block pairs (an interval needs >= 3); pairs 1, 2 "
            "repeat pair 0's observations, counted once: not judged") in verdict
    assert "faster" not in verdict


def test_a_repeat_beside_independent_pairs_is_left_out_of_the_interval(
        fixture_run: PerfRun) -> None:
    """Three independent pairs and a copy of one: the interval is the three pairs' own,
    the same as without the copy."""
    pairs = len(fixture_run.blocks) // 2
    copy = replace(fixture_run, blocks=[*fixture_run.blocks, "OFF", "ON"],
                   observations=[*fixture_run.observations, *(
                       replace(o, block=o.block + 2 * pairs, pair=pairs)
                       for o in fixture_run.observations if o.block < 2)])
    plain, copied = analyse(fixture_run), analyse(copy)
    assert copied.pairing.ok
    assert [(r.per_pair, r.interval) for r in copied.ratios] == \
        [(r.per_pair, r.interval) for r in plain.ratios]
    assert all(r.repeats == ((pairs, 0),) and r.spread.endswith(
        f"; pair {pairs} repeats pair 0's observations, counted once") for r in copied.ratios)
