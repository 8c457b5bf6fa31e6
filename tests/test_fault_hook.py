"""The fault hook in the LMCache server: each class, chosen by the control file, applied
through the wrapper the server calls around LMCache's real ``transfer_kv_per_object_group``
(its torch fallback on CPU, the copy model's registration), placed by the object layout and
logged one JSON line an application; a selected transfer where a class cannot be placed is
logged why, so its cell is VOID; nothing raises into LMCache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

from pytest_sharedkv.engine_hooks import fault_hook
from pytest_sharedkv.engine_hooks.fault_classes import (
    CLASSES,
    HOOK_CLASSES,
    Detector,
    Injector,
    fault_class,
)
from pytest_sharedkv.host.lmcache_api import resolve
from pytest_sharedkv.layouts.object_layout import ATTENTION, RECURRENT
from tests.fault_server import Pair, copy_model_pair

CHUNKS = 4


@pytest.fixture(scope="module")
def pair() -> Pair:
    """One pair for the module: each op takes blocks no other op used."""
    return copy_model_pair(num_blocks=96)


class Armed:
    """A hook armed with CONTROL, wrapping LMCache's transfer as the server's would be."""

    def __init__(self, tmp_path: Path, control: dict[str, Any]) -> None:
        self.control = tmp_path / "fault-control.json"
        self.log = tmp_path / "fault.jsonl"
        self.control.write_text(json.dumps(control))
        self.hook = fault_hook.FaultHook(self.control, str(self.log))
        self.hook.write({"kind": "armed", "control": str(self.control)})
        self.transfer = fault_hook.wrapper(self.hook)(
            "lmcache.v1.multiprocess.object_group_transfer:transfer_kv_per_object_group",
            resolve("transfer_kv_per_object_group"))

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r for r in fault_hook.read_log(self.log) if kind in (None, r["kind"])]


def stored(pair: Pair, request: str = "reqA") -> tuple[list[list[int]], list[Any]]:
    ids = pair.take("a", CHUNKS)
    objs = pair.objects(CHUNKS)
    pair.transfer(resolve("transfer_kv_per_object_group"), "a", ids, objs, "D2H", request)
    return ids, objs


def snapshot(objs: list[Any]) -> list[bytes]:
    return [bytes(fault_hook._raw(o).tolist()) for o in objs]


def same(pair: Pair, group: int, ids_a: list[list[int]], ids_b: list[list[int]],
         chunk: int, chunk_a: int | None = None) -> bool:
    """Whether B's page of CHUNK in kernel group GROUP holds A's of CHUNK_A (default the
    same chunk)."""
    layer = pair.groups[group][0]
    source = ids_a[group][chunk if chunk_a is None else chunk_a]
    return pair.page(pair.b, layer, ids_b[group][chunk]) == pair.page(pair.a, layer, source)


ATTN, GDN0, GDN1 = 2, 0, 1  # the copy model's kernel groups: layer 2 attention, 0 and 1 GDN


def attention_moved(pair: Pair, ids_a: list[list[int]], ids_b: list[list[int]]) -> list[bool]:
    return [same(pair, ATTN, ids_a, ids_b, c) for c in range(CHUNKS)]


def state_moved(pair: Pair, ids_a: list[list[int]], ids_b: list[list[int]]) -> list[bool]:
    return [same(pair, g, ids_a, ids_b, CHUNKS - 1) for g in (GDN0, GDN1)]


def test_an_unselected_retrieve_moves_every_page_and_logs_nothing(
        tmp_path: Path, pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "bit-flip", "requests": ["someone-else"]})
    ids_a, objs = stored(pair)
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs, "H2D", "reqB")
    assert attention_moved(pair, ids_a, ids_b) == [True] * CHUNKS
    assert state_moved(pair, ids_a, ids_b) == [True, True]
    assert armed.records("applied") == [] and armed.records("unplaced") == []
    assert fault_hook.void_problem(armed.records(), "bit-flip") == (
        "VOID: bit-flip was never applied: no transfer it acts on was selected")
    pair.release(objs)


def test_misrouted_exchanges_two_chunks_before_the_last(tmp_path: Path, pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "misrouted"})
    ids_a, objs = stored(pair)
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs, "H2D", "reqB")
    assert [same(pair, ATTN, ids_a, ids_b, c, a) for c, a in enumerate([0, 2, 1, 3])] == [
        True] * CHUNKS
    assert state_moved(pair, ids_a, ids_b) == [True, True]
    (record,) = armed.records("applied")
    assert (record["request"], record["op"], record["swapped"]) == ("reqB", "reqB#1", [1, 2])
    placed = {(p["chunk"], p["region"], p["read"]) for p in record["placements"]}
    assert placed == {(1, ATTENTION, True), (2, ATTENTION, True), (1, RECURRENT, False),
                      (2, RECURRENT, False)}
    assert fault_hook.void_problem(armed.records(), "misrouted") is None
    pair.release(objs)


def test_a_retrieve_too_short_to_misroute_is_logged_unplaced_and_the_cell_void(
        tmp_path: Path, pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "misrouted"})
    ids_a = pair.take("a", 2)
    objs = pair.objects(2)
    pair.transfer(resolve("transfer_kv_per_object_group"), "a", ids_a, objs, "D2H", "reqA")
    ids_b = pair.take("b", 2)
    pair.transfer(armed.transfer, "b", ids_b, objs, "H2D", "reqB")
    assert [same(pair, ATTN, ids_a, ids_b, c) for c in range(2)] == [True, True]
    assert armed.records("applied") == []
    assert fault_hook.void_problem(armed.records(), "misrouted") == (
        "VOID: misrouted was never applied: no two adjacent chunks before the last "
        "(2 chunks)")
    pair.release(objs)


def test_a_key_collision_serves_another_requests_chunk_for_one_retrieve(
        tmp_path: Path, pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "key-collision", "requests": ["reqR2"]})
    ids_1, objs_1 = stored(pair, "reqR1")
    ids_2, objs_2 = stored(pair, "reqR2")
    before = snapshot(objs_2)
    pair.transfer(armed.transfer, "b", pair.take("b", CHUNKS), objs_1, "H2D", "reqR1")
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs_2, "H2D", "reqR2")
    assert attention_moved(pair, ids_2, ids_b) == [True, False, True, True]
    assert same(pair, ATTN, ids_1, ids_b, 1)  # R1's chunk 1 under R2's key
    assert state_moved(pair, ids_2, ids_b) == [True, True]
    assert snapshot(objs_2) == before  # the pool's bytes are put back after the retrieve
    (record,) = armed.records("applied")
    assert (record["request"], record["chunk"], record["donor"]) == (
        "reqR2", 1, {"request": "reqR1", "chunk": 1})
    pair.release(objs_1 + objs_2)


def test_a_lost_write_commits_a_chunk_whose_copy_never_ran(tmp_path: Path,
                                                          pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "lost-write"})
    ids_a = pair.take("a", CHUNKS)
    objs = pair.objects(CHUNKS, fill=0xEE)
    pair.transfer(armed.transfer, "a", ids_a, objs, "D2H", "reqA")
    assert set(snapshot(objs)[1]) == {0xEE}  # never written: the object's old bytes
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(resolve("transfer_kv_per_object_group"), "b", ids_b, objs, "H2D", "reqB")
    assert attention_moved(pair, ids_a, ids_b) == [True, False, True, True]
    assert state_moved(pair, ids_a, ids_b) == [True, True]
    (record,) = armed.records("applied")
    assert (record["direction"], record["chunk"]) == ("D2H", 1)
    assert {(p["region"], p["read"]) for p in record["placements"]} == {
        (ATTENTION, True), (RECURRENT, False)}
    pair.release(objs)


def flipped(pair: Pair, layer: str, block_a: int, block_b: int) -> list[tuple[int, int]]:
    a, b = pair.page(pair.a, layer, block_a), pair.page(pair.b, layer, block_b)
    return [(i, x ^ y) for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


def test_a_bit_flip_lands_in_attention_kv_an_engine_reads(tmp_path: Path, pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "bit-flip", "bit": 3})
    ids_a, objs = stored(pair)
    before = snapshot(objs)
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs, "H2D", "reqB")
    (record,) = armed.records("applied")
    (placed,) = record["placements"]
    chunk = record["chunk"]
    assert (placed["region"], placed["read"], placed["layer"]) == (
        ATTENTION, True, "layer 2")  # the server knows layers by index
    assert flipped(pair, pair.groups[ATTN][0], ids_a[ATTN][chunk], ids_b[ATTN][chunk]) == [
        (record["byte"] - placed["start"], 1 << 3)]
    assert attention_moved(pair, ids_a, ids_b).count(False) == 1
    assert state_moved(pair, ids_a, ids_b) == [True, True]
    assert snapshot(objs) == before
    assert fault_hook.void_problem(armed.records(), "bit-flip") is None
    pair.release(objs)


def test_the_unread_bit_flip_control_lands_where_no_engine_reads(tmp_path: Path,
                                                                 pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "bit-flip-unread"})
    ids_a, objs = stored(pair)
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs, "H2D", "reqB")
    assert attention_moved(pair, ids_a, ids_b) == [True] * CHUNKS
    assert state_moved(pair, ids_a, ids_b) == [True, True]
    (record,) = armed.records("applied")
    (placed,) = record["placements"]
    assert (placed["region"], placed["read"]) == (RECURRENT, False)
    assert record["chunk"] < CHUNKS - 1  # a mid-prompt chunk: its state block is null
    assert fault_hook.void_problem(armed.records(), "bit-flip-unread") is None
    # the same line does not count for the class that must reach an engine
    assert fault_hook.applications(
        [{**record, "class": "bit-flip"}], "bit-flip") == []
    pair.release(objs)


def test_unrestored_state_leaves_the_engines_last_state_block_stale(tmp_path: Path,
                                                                    pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "state-unrestored"})
    ids_a, objs = stored(pair)
    ids_b = pair.take("b", CHUNKS)
    stale = [pair.page(pair.b, pair.groups[g][0], ids_b[g][-1]) for g in (GDN0, GDN1)]
    pair.transfer(armed.transfer, "b", ids_b, objs, "H2D", "reqB")
    assert [pair.page(pair.b, pair.groups[g][0], ids_b[g][-1]) for g in (GDN0, GDN1)] == stale
    assert stale != [pair.page(pair.a, pair.groups[g][0], ids_a[g][-1]) for g in (GDN0, GDN1)]
    assert attention_moved(pair, ids_a, ids_b) == [True] * CHUNKS
    (record,) = armed.records("applied")
    assert record["redirected"] == [{"kernel_group": GDN0, "block_id": ids_b[GDN0][-1]},
                                    {"kernel_group": GDN1, "block_id": ids_b[GDN1][-1]}]
    assert {(p["chunk"], p["region"], p["read"]) for p in record["placements"]} == {
        (CHUNKS - 1, RECURRENT, True)}
    pair.release(objs)


def test_foreign_state_restores_another_requests_last_state(tmp_path: Path,
                                                           pair: Pair) -> None:
    armed = Armed(tmp_path, {"class": "state-foreign", "requests": ["reqR2"]})
    ids_1, objs_1 = stored(pair, "reqR1")
    ids_2, objs_2 = stored(pair, "reqR2")
    before = snapshot(objs_2)
    pair.transfer(armed.transfer, "b", pair.take("b", CHUNKS), objs_1, "H2D", "reqR1")
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs_2, "H2D", "reqR2")
    assert attention_moved(pair, ids_2, ids_b) == [True] * CHUNKS
    assert state_moved(pair, ids_2, ids_b) == [False, False]
    assert [same(pair, g, ids_1, ids_b, CHUNKS - 1) for g in (GDN0, GDN1)] == [True, True]
    assert snapshot(objs_2) == before
    (record,) = armed.records("applied")
    assert record["donor"] == {"request": "reqR1", "chunk": CHUNKS - 1}
    pair.release(objs_1 + objs_2)



def test_a_chosen_request_that_came_first_is_the_donor_of_the_next(tmp_path: Path,
                                                                  pair: Pair) -> None:
    """Every request selected: the first retrieve finds no other request's state (skipped,
    saying so), and its own bytes, kept before anything was placed, serve the second; so a
    cell whose selected requests arrive first is not left without a donor."""
    armed = Armed(tmp_path, {"class": "state-foreign"})
    ids_1, objs_1 = stored(pair, "reqR1")
    _, objs_2 = stored(pair, "reqR2")
    pair.transfer(armed.transfer, "b", pair.take("b", CHUNKS), objs_1, "H2D", "reqR1")
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs_2, "H2D", "reqR2")
    assert [same(pair, g, ids_1, ids_b, CHUNKS - 1) for g in (GDN0, GDN1)] == [True, True]
    (record,) = armed.records("applied")
    assert (record["request"], record["donor"]) == ("reqR2",
                                                    {"request": "reqR1", "chunk": CHUNKS - 1})
    pair.release(objs_1 + objs_2)

# -- the control, the selection, the log, never raising -------------------------------------


@pytest.mark.parametrize(("data", "message"), [
    ([], "the control file holds no JSON object"),
    ({"class": "gremlins"}, "class 'gremlins' is no fault class"),
    ({"class": "delayed-producer"},
     "class 'delayed-producer' is injected by engine_hooks.delay_hook, not this hook"),
    ({"class": 3}, "'class' must name one of misrouted"),
    ({"class": "bit-flip", "every": 0}, "'every' must be an integer >= 1"),
    ({"class": "bit-flip", "bit": 8}, "'bit' must be an integer 0..7"),
    ({"class": "bit-flip", "requests": "reqB"}, "'requests' must be a list"),
])
def test_a_control_the_hook_cannot_follow_says_which_field(data: Any, message: str) -> None:
    with pytest.raises(fault_hook.ControlError, match=message):
        fault_hook.parse_control(data)


def test_one_in_n_requests_is_chosen_the_same_way_every_time() -> None:
    control = fault_hook.parse_control({"class": "misrouted", "every": 3, "seed": 5})
    chosen = [r for r in (f"cmpl-case{i}-0" for i in range(300)) if control.selects(r)]
    assert 70 < len(chosen) < 130
    assert chosen == [r for r in (f"cmpl-case{i}-0" for i in range(300))
                      if fault_hook.parse_control({"class": "misrouted", "every": 3,
                                                   "seed": 5}).selects(r)]
    other = fault_hook.parse_control({"class": "misrouted", "every": 3, "seed": 6})
    assert chosen != [r for r in (f"cmpl-case{i}-0" for i in range(300)) if other.selects(r)]


class Obj:
    def __init__(self, size: int = 64) -> None:
        import torch

        self.raw_data = torch.zeros(size, dtype=torch.uint8)
        self.size = size

    def get_size(self) -> int:
        return self.size


def fake_call(objs: list[Any], direction: str = "TransferDirection.H2D") -> dict[str, Any]:
    return {"cache_context": object(), "block_ids_gpu": [], "memory_objs": objs,
            "object_group_id": 0, "batch_size": 4, "skip_first_n_tokens": 0,
            "direction": direction, "transfer_key": "reqB#7"}


def test_a_layout_it_cannot_read_is_unplaced_and_the_transfer_runs_untouched(
        tmp_path: Path) -> None:
    armed = Armed(tmp_path, {"class": "bit-flip"})
    seen: list[Any] = []
    transfer = fault_hook.wrapper(armed.hook)("m:t", lambda **kw: seen.append(kw))
    objs = [Obj(), Obj(), Obj()]
    transfer(**fake_call(objs))
    assert seen == [fake_call(objs) | {"cache_context": seen[0]["cache_context"]}]
    (record,) = armed.records("unplaced")
    assert record["why"].startswith("the object layout could not be read: AttributeError")
    assert "VOID: bit-flip was never applied: the object layout could not be read" in str(
        fault_hook.void_problem(armed.records(), "bit-flip"))


def test_a_failure_in_the_hook_never_reaches_lmcache(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    armed = Armed(tmp_path, {"class": "bit-flip"})

    def broken(call: Any) -> None:
        raise RuntimeError("placement exploded")

    monkeypatch.setattr(armed.hook, "plan", broken)
    transfer = fault_hook.wrapper(armed.hook)("m:t", lambda **kw: "moved")
    assert transfer(**fake_call([Obj()])) == "moved"
    (record,) = armed.records("error")
    assert record["why"] == "RuntimeError: placement exploded"


def test_a_later_control_is_the_next_cell_and_each_cell_counts_its_own(
        tmp_path: Path, pair: Pair) -> None:
    """The catalogue's cells share one server: a control naming another class replaces the
    last (said in a control line), and each line carries its cell, so a cell whose class
    never applied is VOID whatever the next cell did."""
    armed = Armed(tmp_path, {"class": "bit-flip", "requests": ["nobody"], "cell": "one"})
    ids_a, objs = stored(pair)
    pair.transfer(armed.transfer, "b", pair.take("b", CHUNKS), objs, "H2D", "reqB")
    armed.control.write_text(json.dumps({"class": "misrouted", "cell": "two"}))
    ids_b = pair.take("b", CHUNKS)
    pair.transfer(armed.transfer, "b", ids_b, objs, "H2D", "reqB")
    assert attention_moved(pair, ids_a, ids_b) == [True, False, False, True]
    (switch,) = armed.records("control")
    assert (switch["class"], switch["cell"], switch["replaces"]) == ("misrouted", "two",
                                                                     "bit-flip")
    records = armed.records()
    assert [r["cell"] for r in armed.records("applied")] == ["two"]
    assert fault_hook.void_problem(fault_hook.of_cell(records, "one"), "bit-flip") == (
        "VOID: bit-flip was never applied: no transfer it acts on was selected")
    assert len(fault_hook.applications(fault_hook.of_cell(records, "two"), "misrouted")) == 1
    assert not fault_hook.applications(fault_hook.of_cell(records, "one"), "misrouted")
    pair.release(objs)


def test_a_run_without_the_hook_or_its_target_is_void_naming_why() -> None:
    assert fault_hook.void_problem([], "misrouted") == (
        "VOID: the fault hook never loaded in the LMCache server")
    assert fault_hook.void_problem([{"kind": "armed"}], "misrouted") == (
        "VOID: the fault hook wrapped no transfer (looked in: "
        "lmcache.v1.multiprocess.object_group_transfer:transfer_kv_per_object_group; "
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer:"
        "transfer_kv_per_object_group)")


def test_install_arms_only_with_a_control_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delenv(fault_hook.CONTROL_ENV, raising=False)
    assert fault_hook.install() is None
    # nothing real is wrapped in this process: LMCache's transfer may be imported already
    monkeypatch.setattr(fault_hook, "TARGETS", {"sharedkv_fault_test_absent": ["transfer"]})
    monkeypatch.setenv(fault_hook.CONTROL_ENV, str(tmp_path / "control.json"))
    monkeypatch.setenv(fault_hook.LOG_ENV, str(tmp_path / "fault.jsonl"))
    finder = fault_hook.install()
    assert finder is not None
    sys.meta_path.remove(finder)
    assert [r["kind"] for r in fault_hook.read_log(tmp_path / "fault.jsonl")] == ["armed"]


def test_the_class_table_names_every_class_the_hook_places() -> None:
    assert set(HOOK_CLASSES) == set(fault_hook.PLACERS)
    assert fault_class("l2-load-failure").caught_by == frozenset()
    assert fault_class("l2-load-failure").injector is Injector.L2_FAULT_INJECT
    assert fault_class("misrouted").caught_by == {Detector.AUDIT}
    assert [c.name for c in CLASSES if not c.engine_reads] == [
        "bit-flip-unread", "l2-load-failure"]
    with pytest.raises(KeyError, match="no fault class 'x'"):
        fault_class("x")
