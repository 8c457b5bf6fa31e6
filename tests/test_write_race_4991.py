"""LMCache #4991's condition forced and shown (``stack/checks/l2_write_race.py``, its hook
``engine_hooks/write_race_hook.py``): the judge on planted hook lines and fetches; the real
cell (three CPU LMCache servers over one ``fs`` directory, about 50 s of one worker) where
LMCache is installed; and the committed reports of its runs
(``fixtures/lmcache/cpu/lmcache-4991-write-race*.json``), whose figures the field-report
row states."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.stack.checks import l2_write_race
from pytest_sharedkv.stack.checks.l2_write_race import Verdict, judge
from tests.conftest import keep_loaded

keep_loaded("torch", "lmcache")

FIXTURES = Path(__file__).parent.parent / "fixtures" / "lmcache" / "cpu"
REPORTS = {"plain": FIXTURES / "lmcache-4991-write-race.json",
           "hold": FIXTURES / "lmcache-4991-write-race-hold.json",
           "truncate": FIXTURES / "lmcache-4991-write-race-truncate.json"}
FILE = "m@0x01000100@0@ab@wr4991.tmp"
LINES: list[dict[str, Any]] = [
    {"event": "open", "role": "fail", "file": FILE},
    {"event": "short", "role": "fail", "file": FILE, "offset": 32775, "size": 65536},
    {"event": "begun", "role": "race", "file": FILE, "size": 65536, "saw": True},
    {"event": "raise", "role": "fail", "file": FILE, "offset": 32775, "size": 65536,
     "saw": True},
]
HELD: dict[str, Any] = {"event": "held", "role": "race", "file": FILE, "saw": True}
WHOLE: dict[str, Any] = {"hit_tokens": 2048, "retrieved": True, "pages_compared": 256,
         "chunks": ["writer 2"] * 3 + ["writer 1"] * 5}


def _verdict(lines: list[dict[str, Any]] = LINES, fetch: dict[str, Any] | None = None,
             hold: bool = False) -> tuple[Verdict, str]:
    return judge(lines, WHOLE if fetch is None else fetch, hold)


def test_the_condition_with_whole_chunks_or_a_miss_is_not_reproduced() -> None:
    verdict, why = _verdict()
    assert verdict is Verdict.NOT_REPRODUCED
    assert "stopped at offset 32775 of 65536" in why and "hit 2048 tokens" in why
    miss = {"hit_tokens": 0, "retrieved": False, "pages_compared": 0, "chunks": []}
    assert _verdict(fetch=miss)[0] is Verdict.NOT_REPRODUCED
    assert _verdict([*LINES, HELD], hold=True)[0] is Verdict.NOT_REPRODUCED


@pytest.mark.parametrize("chunk", ["mixed", "other", "unchanged"])
def test_a_served_chunk_not_wholly_one_writers_is_reproduced(chunk: str) -> None:
    verdict, why = _verdict(fetch={**WHOLE, "chunks": ["writer 2", chunk, *["writer 1"] * 6]})
    assert verdict is Verdict.REPRODUCED
    assert f"chunk(s) 1 not wholly one writer's bytes ({chunk})" in why


def test_a_hit_whose_retrieve_failed_is_reproduced() -> None:
    assert _verdict(fetch={**WHOLE, "retrieved": False})[0] is Verdict.REPRODUCED


@pytest.mark.parametrize(("lines", "why"), [
    ([], "logged no short write"),
    ([{**LINES[1], "offset": 65536}, *LINES[2:]], "stopped at 65536 of 65536: not part-way"),
    ([{**LINES[1], "offset": 0}, *LINES[2:]], "stopped at 0 of 65536"),
    ([LINES[1], LINES[3]], "writer 2's write of the key did not begin"),
    ([LINES[1], {**LINES[2], "saw": False}, LINES[3]], "did not begin after"),
    ([LINES[1], {**LINES[2], "file": "other.tmp"}, LINES[3]], "raced different keys"),
    (LINES[1:3], "writer 1 did not fail"),
    ([*LINES[1:3], {**LINES[3], "saw": False}], "writer 1 did not fail"),
])
def test_without_the_interleaving_the_cell_is_void(lines: list[dict[str, Any]],
                                                   why: str) -> None:
    verdict, text = _verdict(lines)
    assert verdict is Verdict.VOID and why in text, text


TRUNC: list[dict[str, Any]] = [
    {"event": "written", "role": "race", "file": FILE, "offset": 65536, "size": 65536},
    {"event": "waited", "role": "fail", "file": FILE, "saw": True},
    {"event": "open", "role": "fail", "file": FILE},
    {"event": "replace", "role": "race", "file": FILE, "ok": True},
    {"event": "raise", "role": "fail", "file": FILE, "offset": 0, "size": 65536, "saw": True},
]


def test_the_truncating_order_is_judged_by_its_own_lines() -> None:
    miss = {"hit_tokens": 0, "retrieved": False, "pages_compared": 0, "chunks": []}
    verdict, why = judge(TRUNC, miss, truncate=True)
    assert verdict is Verdict.NOT_REPRODUCED and "opened (truncated) it" in why
    verdict, why = judge(TRUNC, {**WHOLE, "retrieved": False}, truncate=True)
    assert verdict is Verdict.REPRODUCED and "stayed visible" in why
    for lines, text in ((TRUNC[1:], "did not write its whole entry"),
                        ([TRUNC[0], *TRUNC[2:]], "did not open the same staging file"),
                        ([*TRUNC[:3], {**TRUNC[3], "ok": False}, TRUNC[4]], "did not rename"),
                        (TRUNC[:4], "did not fail after")):
        verdict, why = judge(lines, miss, truncate=True)
        assert verdict is Verdict.VOID and text in why, why


def test_the_held_order_without_the_unlink_or_a_reader_without_a_fetch_is_void() -> None:
    verdict, text = _verdict(LINES, hold=True)
    assert verdict is Verdict.VOID and "clean-up did not unlink" in text
    verdict, text = judge(LINES, None)
    assert verdict is Verdict.VOID and "did not fetch" in text
    verdict, text = judge(LINES, {"error": "TimeoutError: no answer"})
    assert verdict is Verdict.VOID and "TimeoutError" in text


# -- the committed reports, and the real cell -------------------------------------------

def _report(order: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REPORTS[order].read_text())
    return data


@pytest.mark.parametrize("order", list(REPORTS))
def test_a_committed_report_is_what_its_own_lines_judge(order: str) -> None:
    """The verdict a report states is the one judge() gives its hook lines and counts: a
    report edited by hand, or a judge changed since the run, fails here."""
    report = _report(order)
    fetch = {"hit_tokens": report["counts"]["keys_served"] * report["chunk_tokens"],
             "retrieved": report["retrieved"],
             "pages_compared": report["counts"]["pages_compared"],
             "chunks": report["chunks"]}
    hold, truncate = order == "hold", order == "truncate"
    verdict, why = judge(report["hook_lines"], fetch, hold, truncate)
    assert (verdict.value, why) == (report["verdict"], report["why"])
    assert (report["hold"], report.get("truncate", False)) == (hold, truncate)
    assert report["l2"] == "fs" and report["lmcache"] == "0.5.6"
    pages = report["counts"]["pages"] or {}
    assert sum(pages.values()) == report["counts"]["pages_compared"]


def test_the_committed_runs_show_the_condition_and_what_lmcache_did() -> None:
    """The figures the field-report row states, read from the reports."""
    plain, held, truncated = _report("plain"), _report("hold"), _report("truncate")
    for report in (plain, held):
        assert report["verdict"] == "not reproduced", report["why"]
        short = report["condition"]["short"]
        assert 0 < short["offset"] < short["size"], short
    # LMCache's order: writer 2 renamed its staging file before writer 1 failed
    order = plain["condition"]["order"]
    assert order.index("race:replace") < order.index("fail:raise"), order
    assert plain["raced_entry"]["bytes"] == plain["condition"]["short"]["size"]
    # held: writer 1's clean-up unlinked writer 2's staging file; writer 2's rename failed
    held_lines = held["hook_lines"]
    assert any(e["event"] == "unlink" and e["role"] == "fail" and e["ok"]
               for e in held_lines)
    raced = held["condition"]["short"]["file"]
    assert [e.get("error") for e in held_lines if e["event"] == "replace"
            and e["role"] == "race" and e["file"] == raced] == ["FileNotFoundError"]
    # truncating: writer 2's rename succeeded, writer 1's failed open left the entry empty;
    # the reader missed it (LMCache did not serve the 0-byte entry)
    assert truncated["verdict"] == "not reproduced", truncated["why"]
    raced = truncated["condition"]["raise"]["file"]
    assert [e["ok"] for e in truncated["hook_lines"] if e["event"] == "replace"
            and e["role"] == "race" and e["file"] == raced] == [True]
    assert truncated["raced_entry"]["bytes"] == 0 and truncated["counts"]["keys_served"] == 0


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache is not installed")
    return l2_write_race.run(Path(tmp_path_factory.mktemp("write-race")))


def test_a_write_failing_part_way_beside_another_writer_never_serves_a_torn_entry(
        real: dict[str, Any]) -> None:
    """The cell in CI: the interleaving must occur (else VOID fails here) and the reader's
    every served chunk must be one writer's whole (a torn one fails naming it)."""
    assert real["verdict"] != "void", real["why"]
    assert real["verdict"] == "not reproduced", real["why"]
    counts = real["counts"]
    assert counts["stores_failed"]["writer 1"] >= 1, counts  # the failure it was given
    assert counts["pages_compared"] == sum((counts["pages"] or {}).values())
