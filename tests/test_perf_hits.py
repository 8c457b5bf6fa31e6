"""Pool hits behind the cross-replica numbers: an ON cross-replica request that found less
than every whole chunk of its prompt in a cache is marked PARTIAL, its size's cross ratio is
not judged, and a run without counts or a chunk size says it could not check."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_sharedkv.perf.hits import full_hit_tokens, partial_hits
from pytest_sharedkv.perf.observations import Observation, PerfRun, from_json, to_json
from pytest_sharedkv.perf.statistics import analyse
from pytest_sharedkv.perf.tables import hit_verdict, report_lines

SCREENING = Path(__file__).resolve().parents[1] / "fixtures" / "perf" / "screening.json"


@pytest.fixture(scope="module")
def fixture_run() -> PerfRun:
    return from_json(json.loads(SCREENING.read_text())["perf"])


def _starve(run: PerfRun, size: str, keep: float) -> PerfRun:
    """RUN with the ON cross requests of SIZE finding only KEEP of their prompt."""
    return replace(run, observations=[
        replace(o, cached_tokens=int(o.prompt_tokens * keep))
        if (o.arm, o.step, o.size) == ("ON", "cross", size) else o
        for o in run.observations])


def test_a_full_hit_is_every_whole_chunk_but_the_last_token() -> None:
    assert full_hit_tokens(7841, 1568) == 7840  # the service corpus's m * chunk + 1
    assert full_hit_tokens(7000, 1568) == 6272  # text of any length: whole chunks only
    assert full_hit_tokens(1, 256) == 0


def test_partial_hits_are_judged_only_on_the_pooled_arm(fixture_run: PerfRun) -> None:
    chunk = fixture_run.chunk_tokens
    assert chunk == 256 and partial_hits(fixture_run.observations, chunk) == []
    starved = _starve(fixture_run, "32k", 0.4)
    missed = partial_hits(starved.observations, chunk)
    assert len(missed) == 6 and {(o.arm, o.step, o.size) for o in missed} == \
        {("ON", "cross", "32k")}
    one_short = [replace(o, cached_tokens=full_hit_tokens(o.prompt_tokens, chunk) - 1)
                 for o in fixture_run.observations]
    assert {o.arm for o in partial_hits(one_short, chunk)} == {"ON"}  # OFF misses by design
    assert partial_hits(starved.observations, None) == []  # no chunk: nothing judged


def test_partial_hits_mark_the_floor_table_and_unjudge_their_size(
        fixture_run: PerfRun) -> None:
    text = "\n".join(report_lines(analyse(_starve(fixture_run, "32k", 0.4))))
    rows = [line for line in text.splitlines() if line.startswith("| 32k  | ON ")]
    assert any("PARTIAL (6 of 6 not full pool hits)" in r and "40%" in r for r in rows)
    verdicts = {line.split(":")[0]: line for line in text.splitlines()
                if line.startswith("VERDICT")}
    assert "NOT JUDGED (6 ON requests were partial pool hits)" in \
        verdicts["VERDICT perf"].split("32k ON/OFF")[1]
    assert "8k ON/OFF" in verdicts["VERDICT perf"] and \
        verdicts["VERDICT perf"].count("NOT JUDGED") == 1
    hits = verdicts["VERDICT hits"]
    assert "PARTIAL: 6 of 18" in hits and "32k: 6 of 6, median 40%" in hits


def test_a_run_without_counts_or_chunk_says_it_could_not_check(
        fixture_run: PerfRun) -> None:
    no_counts = replace(fixture_run, observations=[
        replace(o, cached_tokens=None) for o in fixture_run.observations])
    assert "no cached-token counts" in str(hit_verdict(analyse(no_counts)))
    assert "no chunk size" in str(hit_verdict(analyse(replace(fixture_run,
                                                              chunk_tokens=None))))
    off_only = replace(fixture_run, observations=[
        o for o in fixture_run.observations if o.arm == "OFF"])
    assert hit_verdict(analyse(off_only)) is None


def test_older_reports_without_counts_still_read(fixture_run: PerfRun) -> None:
    data = to_json(fixture_run)
    del data["chunk_tokens"]
    for o in data["observations"]:
        del o["cached_tokens"]
    run = from_json(data)
    assert run.chunk_tokens is None and all(o.cached_tokens is None
                                            for o in run.observations)
    data["chunk_tokens"] = 0
    with pytest.raises(ValueError, match="chunk_tokens"):
        from_json(data)


def test_the_engine_count_reaches_the_observation() -> None:
    from pytest_sharedkv.perf.timing import Timing, observation

    timing = Timing("B", 0.5, 0.5, 0.9, 1.0, 16, 7841, 7840)
    made: Observation = observation(timing, arm="ON", block=1, pair=0, size="8k",
                                    step="cross", request="8k-00", payload_sha256="x")
    assert made.cached_tokens == 7840
