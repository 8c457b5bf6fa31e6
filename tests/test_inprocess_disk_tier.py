"""LMCache #4385 at LMCache's storage layer, on CPU (``tests/disk_tier.py``): LMCache's
engine in this process, a ``local_cpu`` tier of 24 chunks (half the sessions' KV) and a
``local_disk`` tier behind it, as the in-process connector configures replica A; 8
sessions of 2 turns of 3 chunks (256 KiB each), the second turn loading the first back
before it stores, the earliest sessions evicted from the CPU tier, every session
returning; every load compared byte for byte. The clean run; the control (two chunks'
files swapped on disk: the check fails naming the other session); a CPU tier that holds
everything is VOID; stores meeting disk writes in flight; the verdict's order. About 3 s
a run on one core; a precise skip where LMCache's engine does not import."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from tests import disk_tier
from tests.disk_tier import DiskPagingOutcome, SessionSeen


def _engine_problem() -> str | None:
    try:
        import lmcache.v1.cache_engine
        import lmcache.v1.gpu_connector.mock_gpu_connector  # noqa: F401
    except Exception as exc:  # absent, or its extension does not load here
        return f"LMCache's in-process engine does not import here: {type(exc).__name__}: {exc}"
    return None


ENGINE_PROBLEM = _engine_problem()
needs_lmcache = pytest.mark.skipif(ENGINE_PROBLEM is not None, reason=str(ENGINE_PROBLEM))


def _summary(outcome: DiskPagingOutcome) -> dict[str, Any]:
    found = outcome.as_dict()
    return {k: found[k] for k in ("lmcache", "status", "totals", "returns", "planted", "errors",
                                  "void")}


@needs_lmcache
def test_sessions_paged_to_disk_come_back_byte_for_byte(tmp_path: Path) -> None:
    """Not reproduced on LMCache 0.5.6's storage path (CPU): the counts of each run are
    printed (``-s``) for the field-report row."""
    method = multiprocessing.get_start_method(allow_none=True)
    outcome = disk_tier.check_disk_paging(tmp_path)
    print(json.dumps(_summary(outcome)))
    assert outcome.verdict() == ("disk-paging", "pass"), outcome.as_dict()
    returns = outcome.totals("return")
    assert returns["from_disk"] > 0, returns  # else nothing was tested (VOID)
    assert returns["stored"] == returns["chunks"] == 8 * 6
    assert [s.visit for s in outcome.sessions] == ["turn 1"] * 8 + ["return"] * 8
    loads = outcome.totals("turn 1")
    assert 0 < loads["from_disk"] <= loads["disk_served"] < loads["chunks"]  # CPU and disk
    assert all(s.retrieved == s.stored for s in outcome.sessions), outcome.sessions
    earliest = outcome.returns()[0]
    assert earliest.from_disk == earliest.chunks
    assert outcome.errors == []
    assert multiprocessing.get_start_method(allow_none=True) == method  # LMCache forces spawn
    config = (tmp_path / "lmcache-A.yaml").read_text()  # the connector's file for replica A
    assert f"local_disk: \"{tmp_path / 'disk' / 'A'}\"" in config
    assert f"max_local_cpu_size: {disk_tier.tier_gb(24)!r}" in config


@needs_lmcache
def test_a_swapped_file_on_disk_fails_naming_the_donor(tmp_path: Path) -> None:
    """The control: the earliest session's first chunk on disk only and the last
    session's first chunk exchange files; LMCache serves each key the other's bytes and
    logs nothing (no checksum on the disk tier), and the check names the donor."""
    outcome = disk_tier.check_disk_paging(tmp_path, plant="swap")
    print(json.dumps(_summary(outcome)))
    assert outcome.planted is not None and "session 7 chunk 0" in outcome.planted
    assert outcome.verdict() == ("bytes", "fail"), outcome.as_dict()
    returns = outcome.returns()
    first, last = returns[0], returns[-1]
    assert first.wrong == 1 and list(first.donors.values()) == ["session 7 chunk 0"]
    assert last.donors in ({}, {0: f"session 0 chunk {next(iter(first.donors))}"})
    assert sum(s.wrong for s in returns[1:-1]) == 0
    assert outcome.totals("turn 1")["wrong"] == 0  # planted after the turns
    assert outcome.errors == []


@needs_lmcache
def test_a_cpu_tier_that_holds_every_chunk_is_void(tmp_path: Path) -> None:
    outcome = disk_tier.check_disk_paging(tmp_path, cpu_chunks=64)
    assert outcome.verdict() == ("void", "void"), outcome.as_dict()
    assert outcome.totals()["from_disk"] == 0
    assert "nothing came from disk" in str(outcome.void)


@needs_lmcache
def test_stores_that_meet_disk_writes_in_flight_never_give_a_wrong_byte(
        tmp_path: Path) -> None:
    """Disk writes waited for only after the last store: LMCache may cut a store short
    ("Local cpu memory under pressure", cache_engine.py), a miss, never a wrong byte."""
    outcome = disk_tier.check_disk_paging(tmp_path, settle_each_turn=False)
    print(json.dumps(_summary(outcome)))
    assert outcome.verdict()[1] != "fail", outcome.as_dict()
    assert all(s.retrieved <= s.stored for s in outcome.sessions), outcome.sessions


@needs_lmcache
def test_chunks_put_again_while_on_disk_never_give_a_wrong_byte(tmp_path: Path) -> None:
    """Every session begins with the same 2 chunks and each turn stores its whole prompt
    (what concurrent requests of one prefix that all missed it do): chunks already in
    either tier are put again, the path LMCache changed after 0.5.2 (0.5.2's disk tier
    rewrote a file it held in place, ``local_disk_backend.py`` ``submit_put_task``)."""
    outcome = disk_tier.check_disk_paging(tmp_path, shared_chunks=2, store_whole_prompt=True,
                                          settle_each_turn=False)
    print(json.dumps(_summary(outcome)))
    assert outcome.verdict() == ("disk-paging", "pass"), outcome.as_dict()
    assert outcome.totals()["from_disk"] > 0


def _seen(wrong: int = 0, from_disk: int = 6) -> SessionSeen:
    return SessionSeen(session=0, visit="return", chunks=6, stored=6, from_disk=from_disk,
                       disk_served=from_disk, missing=0,
                       retrieved=6, wrong=wrong,
                       donors={2: "session 3 chunk 2"} if wrong else {})


def test_the_verdict_puts_wrong_bytes_before_problems_and_void() -> None:
    assert DiskPagingOutcome([_seen()]).verdict() == ("disk-paging", "pass")
    assert DiskPagingOutcome([_seen(wrong=1)], problems=["x"],
                             void="VOID: y").verdict() == ("bytes", "fail")
    assert DiskPagingOutcome([_seen()], problems=["x"]).verdict() == ("disk", "fail")
    assert DiskPagingOutcome([_seen(from_disk=0)], void="VOID: y").verdict() == (
        "void", "void")
    found = DiskPagingOutcome([_seen(wrong=1), _seen()]).as_dict()
    assert found["totals"] == {"chunks": 12, "stored": 12, "from_disk": 12,
                               "disk_served": 12, "missing": 0, "retrieved": 12, "wrong": 1}
    assert found["sessions"][0]["donors"] == {2: "session 3 chunk 2"}
    assert found["returns"] == found["totals"]


def test_an_unknown_plant_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plant must be one of"):
        disk_tier.check_disk_paging(tmp_path, plant="flip")
