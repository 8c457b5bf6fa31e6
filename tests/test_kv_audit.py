"""The in-engine KV audit on CPU: the hook on a stand-in for LMCache's connector (CPU
tensors, the same entry points and adapter attributes as LMCache 0.5.6), and the
comparison on recorded digest logs: a planted stale chunk is named with whose bytes B
got, a clean audit passes, an audit that compared nothing is VOID."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.stack import kv_audit

torch = pytest.importorskip("torch")

CHUNK, TPB = 32, 16  # LMCache chunk tokens, engine tokens per block
BPC = CHUNK // TPB


@dataclass(frozen=True)
class Group:  # LMCache's EngineGroupInfo, the fields the hook reads
    layer_indices: tuple[int, ...]
    tokens_per_block: int
    recurrent_state: bool = False


@dataclass(frozen=True)
class Group053:  # LMCache 0.5.3's EngineGroupInfo: no recurrent_state field
    layer_indices: tuple[int, ...]
    tokens_per_block: int


@dataclass
class Op:  # LMCache's LoadStoreOp
    token_ids: list[int]
    block_ids: list[list[int]]
    start: int
    end: int
    skip_first_n_tokens: int = 0


@dataclass
class Meta:
    request_id: str
    direction: str
    op: Op
    cache_salt: str = "salt-1"


@dataclass
class Metadata:
    requests: list[Meta] = field(default_factory=list)


class Adapter:
    lmcache_tokens_per_chunk = CHUNK

    def __init__(self, kv: dict[str, Any]) -> None:
        self.kv_caches = kv
        # group 0: attention (layers 0, 1); group 1: recurrent state (layer 2)
        self.engine_group_infos = [Group((0, 1), TPB), Group((2,), TPB, True)]

    def _block_ids_per_group(self, op: Op) -> list[list[int]]:
        return [list(b) for b in op.block_ids]


def connector_class() -> type:
    class Connector:  # LMCache's LMCacheMPConnector, reduced to what the hook wraps
        def __init__(self, kv: dict[str, Any]) -> None:
            self.worker_adapter = Adapter(kv)
            self.metadata = Metadata()
            self.finished: set[str] = set()

        def _get_connector_metadata(self) -> Metadata:
            return self.metadata

        def register_kv_caches(self, kv_caches: Any) -> None:
            return None

        def wait_for_save(self) -> None:
            return None

        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            return None

        def get_finished(self, finished: set[str]) -> tuple[set[str], set[str]]:
            done, self.finished = self.finished, set()
            return set(), done

    return Connector


def kv_tensors(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}": torch.randn(64, 2, TPB, 1, 8, generator=g).to(torch.bfloat16)
            for i in range(3)}


TOKENS = list(range(1000, 1000 + 4 * CHUNK + 1))  # 4 chunks and one token to recompute


def as_053(connector: Any) -> dict[str, Any]:
    """LMCache 0.5.3's registration: its groups carry no recurrent flag, and vLLM hands
    the state layer over as a list of tensors, which LMCache re-views as one."""
    adapter = connector.worker_adapter
    adapter.engine_group_infos = [Group053(g.layer_indices, g.tokens_per_block)
                                  for g in adapter.engine_group_infos]
    return {n: [t] if n == "layers.2" else t for n, t in adapter.kv_caches.items()}


def run_pair(tmp_path: Path, corrupt: Any = None, skip: int = 0, release: str = "0.5.6",
             a_kept_state: bool = True) -> list[dict[str, Any]]:
    """A stores 4 chunks; B's pages get A's bytes (then CORRUPT(b_kv, a_blocks, b_blocks))
    and B loads them. A_KEPT_STATE False: A's last chunk has no state block (the null
    block, as where no scheduler step of A ended there), B's has one."""
    from pytest_sharedkv.engine_hooks.kv_audit_hook import AuditLog, patch_connector

    a_blocks = list(range(1, 9))
    b_blocks = list(range(20, 28))
    # recurrent state lives in the last block of the last chunk only (align mode)
    a_state = [0] * 7 + [9 if a_kept_state else 0]
    b_state = [0] * 7 + [29]
    classes = {}
    for role in ("A", "B"):
        classes[role] = patch_connector(connector_class(), AuditLog(tmp_path, role))
    a = classes["A"](kv_tensors(1))
    b = classes["B"](kv_tensors(2))
    for connector in (a, b):
        registered = (as_053(connector) if release == "0.5.3"
                      else connector.worker_adapter.kv_caches)
        connector.register_kv_caches(registered)
    a.metadata = Metadata([Meta("cmpl-sharedkv.3k-001.cold.A-0-ab12", "STORE",
                                Op(TOKENS, [a_blocks, a_state], 0, 4 * CHUNK))])
    a.wait_for_save()
    for name, tensor in b.worker_adapter.kv_caches.items():  # the transfer
        src = a.worker_adapter.kv_caches[name]
        tensor[b_blocks] = src[a_blocks]
        tensor[29] = src[9]
    if corrupt is not None:
        corrupt(b.worker_adapter.kv_caches, b_blocks)
    rid = "cmpl-sharedkv.3k-001.cross.B-0-cd34"
    b.metadata = Metadata([Meta(rid, "RETRIEVE", Op(TOKENS, [b_blocks, b_state], 0,
                                                    4 * CHUNK, skip))])
    b.start_load_kv(None)
    b.finished = {rid}
    b.get_finished(set())
    return kv_audit.read_records(tmp_path)


def test_a_clean_transfer_is_audited_chunk_by_chunk(tmp_path: Path) -> None:
    report = kv_audit.compare(run_pair(tmp_path))
    assert report.void is None and report.mismatches == []
    # 4 chunks x 2 attention layers, plus the recurrent state of the last chunk
    assert report.compared == 4 * 2 + 1
    assert report.chunks_per_request == {"3k-001": 4}
    assert report.audited_tokens == 2 * 4 * CHUNK and report.cost_us_per_token() is not None
    assert "every loaded chunk equals the stored one" in report.summary("mixed")


def test_a_stale_chunk_is_named_with_whose_bytes_b_got(tmp_path: Path) -> None:
    def stale(kv: dict[str, Any], b_blocks: list[int]) -> None:
        # chunk 2 of B holds chunk 1's bytes: the stale-staging-buffer signature
        for tensor in kv.values():
            tensor[b_blocks[2 * BPC:3 * BPC]] = tensor[b_blocks[BPC:2 * BPC]].clone()

    report = kv_audit.compare(run_pair(tmp_path, stale))
    assert {(m.request, m.step, m.chunk, m.group) for m in report.mismatches} == {
        ("3k-001", "cross", 2, 0)}
    assert sorted(m.layer for m in report.mismatches) == ["layers.0", "layers.1"]
    line = report.mismatches[0].line()
    assert "request 3k-001 (cross on B): chunk 2, group 0 (KV)" in line
    assert "equal replica A's chunk 1 of request 3k-001" in line
    assert "2 mismatching digests in 1 requests" in report.summary("lazy")


@pytest.mark.parametrize("release", ["0.5.6", "0.5.3"])
def test_zeroed_recurrent_state_is_caught(tmp_path: Path, release: str) -> None:
    """And counted as recurrent state on 0.5.3 too, whose groups do not say which is."""
    def zero_state(kv: dict[str, Any], b_blocks: list[int]) -> None:
        kv["layers.2"][29] = 0

    report = kv_audit.compare(run_pair(tmp_path, zero_state, release=release))
    assert report.compared_state == 1
    assert report.counts() == {"compared": 9, "compared_state": 1, "unmatched": 0,
                               "unmatched_state": 0}
    assert "(8 attention KV, 1 recurrent state)" in report.summary("lazy")
    assert [(m.chunk, m.group, m.recurrent, m.equals) for m in report.mismatches] == [
        (3, 1, True, None)]
    assert "equal no chunk any replica stored" in report.mismatches[0].line()


def test_recurrent_state_a_never_stored_is_named_by_request(tmp_path: Path) -> None:
    """B resumed from a state block where A kept none (on the H200: a hit trimmed by an L2
    fault ended where no scheduler step of A ended): not judged, but counted and named, so
    a wrong answer can be read beside it."""
    report = kv_audit.compare(run_pair(tmp_path, a_kept_state=False))
    assert report.counts() == {"compared": 8, "compared_state": 0, "unmatched": 1,
                               "unmatched_state": 1}
    assert report.unkept_state == {"3k-001": 1}
    assert report.summary("mixed").endswith(
        "; 1 loads (1 of them recurrent state) had no store of the same chunk by A and were "
        "not judged (B resumed 1 requests from recurrent state of chunks A stored without "
        "one: 3k-001)")
    assert kv_audit.compare(run_pair(tmp_path / "kept")).unkept_state == {}


def test_a_state_load_of_a_chunk_a_never_stored_is_not_called_unkept() -> None:
    """Unkept means A stored the chunk with no state; a chunk A never stored at all (B's
    own earlier store, another run's) is only unmatched."""
    load = {"kind": "load", "role": "B", "key": "k9", "group": 1, "layer": "layers.2",
            "digest": "d", "request": "cmpl-sharedkv.3k-001.cross.B-0-cd34", "chunk": 9,
            "recurrent": True}
    store = {"kind": "store", "role": "A", "key": "k9", "group": 0, "layer": "layers.0",
             "digest": "e", "request": "cmpl-sharedkv.3k-001.cold.A-0-ab12", "chunk": 9}
    alone = kv_audit.compare([load])
    assert (alone.unmatched_state, alone.unkept_state) == (1, {})
    beside = kv_audit.compare([store, load])
    assert (beside.unmatched_state, beside.unkept_state) == (1, {"3k-001": 1})


def test_chunks_the_server_skips_are_not_judged(tmp_path: Path) -> None:
    def stale_first(kv: dict[str, Any], b_blocks: list[int]) -> None:
        for tensor in kv.values():
            tensor[b_blocks[:BPC]] = 0

    report = kv_audit.compare(run_pair(tmp_path, stale_first, skip=CHUNK))
    assert report.mismatches == [] and report.chunks_per_request == {"3k-001": 3}


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_an_audit_that_compared_nothing_is_void(tmp_path: Path) -> None:
    assert "never saw replica A or B register" in str(kv_audit.compare([]).void)
    registered = [{"role": r, "kind": "registered"} for r in ("A", "B")]
    load = {"role": "B", "kind": "load", "request": "x", "key": "k", "group": 0,
            "layer": "l", "chunk": 0, "digest": "d"}
    void = kv_audit.compare([*registered, load]).void
    assert void is not None and void.startswith("VOID: no chunk B loaded could be compared")
    unsupported = kv_audit.compare([*registered, {"role": "A", "kind": "unsupported",
                                                  "missing": ["kv_caches"]}]).void
    assert unsupported is not None and "entry points are missing" in unsupported
    # a torn last line (a killed engine) is skipped, not an error
    _write(tmp_path / "kv-audit-A-1.jsonl", registered)
    with (tmp_path / "kv-audit-A-1.jsonl").open("a") as fh:
        fh.write('{"role": "A", "kind": "sto')
    assert len(kv_audit.read_records(tmp_path)) == 2
    assert kv_audit.audit(None) is None


def test_the_hook_never_breaks_the_engine(tmp_path: Path) -> None:
    from pytest_sharedkv.engine_hooks.kv_audit_hook import AuditLog, patch_connector

    cls = patch_connector(connector_class(), AuditLog(tmp_path, "A"))
    conn = cls(kv_tensors(1))
    conn.metadata = Metadata([Meta("r", "STORE", Op(TOKENS, [[1]], 0, CHUNK))])
    del conn.worker_adapter.kv_caches  # the adapter changed shape: an error record
    conn.wait_for_save()
    kinds = [r["kind"] for r in kv_audit.read_records(tmp_path)]
    assert kinds == ["error"]


def test_gate_mismatches_are_the_audits_positive_control() -> None:
    @dataclass
    class Case:
        role: str
        source_chunk: int | None = None

    cases = {"control-0": Case("control", 47), "3k-001": Case("measured", 3),
             "3k-002": Case("measured", 5)}
    mismatches = [kv_audit.Mismatch("control-0", "cross", 47, 0, "l", False, None),
                  kv_audit.Mismatch("3k-001", "cross", 3, 0, "l", False, None)]
    report = kv_audit.AuditReport(compared=10, mismatches=mismatches)
    gate, faults = kv_audit.split_gate(report, cases, 47)
    assert [m.request for m in gate] == ["control-0"] and [m.request for m in faults] == [
        "3k-001"]
    lines = kv_audit.correlation(faults, ["3k-001", "3k-002"], cases)
    assert lines[0].endswith("2 requests diverged after cross-replica hits; 1 have a "
                             "mismatch in the chunk they copy from, 0 only in other chunks, "
                             "1 none")
    assert "3k-002" in lines[1]


def test_the_replica_tier_round_fails_on_an_audited_mismatch(tmp_path: Path) -> None:
    """The replica tier's round reads the same audit: exact answers (this tiny stand-in
    answers alike) do not pass a round whose bytes differed, and an empty audit is VOID."""
    from pytest_sharedkv.corpus.cases import Case, CaseSet
    from pytest_sharedkv.replica_pair.round import cross_replica_round
    from pytest_sharedkv.report.records import Bundle, ResultSink
    from pytest_sharedkv.stack.namespaces import Namespaces
    from pytest_sharedkv.stack.pair import Reply

    class Pair:
        labels = {"provider": "vllm", "allocator": "lazy", "delay": "0"}
        description = "stand-in pair"
        inject_log = None

        def __init__(self, audit: Path) -> None:
            self.kv_audit_dir = audit
            self.sent: list[str | None] = []

        def send(self, name: str, prompt: str, max_tokens: int, salt: str | None,
                 request_id: str | None = None) -> Reply:
            self.sent.append(request_id)
            hit = 96 if name == "B" else 0
            return Reply(name, " same", 97, hit, 0, hit, 0.01)

    cases = CaseSet("text", 96, [Case("text-3k-000", "measured", "3k", "x", "ab")])
    bundle = Bundle()
    registered = [{"role": r, "kind": "registered"} for r in ("A", "B")]
    row = {"key": "k", "group": 0, "layer": "l", "chunk": 0}
    _write(tmp_path / "kv-audit-A-1.jsonl", [*registered, {
        **row, "role": "A", "kind": "store", "digest": "aa",
        "request": "cmpl-sharedkv.text-3k-000.cold.A-0-x1"}])
    _write(tmp_path / "kv-audit-B-2.jsonl", [{
        **row, "role": "B", "kind": "load", "digest": "bb",
        "request": "cmpl-sharedkv.text-3k-000.cross.B-0-x2"}])
    pair = Pair(tmp_path)
    verdict = cross_replica_round(pair, Namespaces("run", "node"),  # type: ignore[arg-type]
                                  ResultSink("node", bundle), cases, 1, 0.0)
    assert pair.sent == ["sharedkv.text-3k-000.cold.A", "sharedkv.text-3k-000.cross.B"]
    assert not verdict.ok
    assert "request text-3k-000 (cross on B): chunk 0, group 0 (KV), layer l" in verdict.message
    [check] = bundle.checks
    assert {k: check.detail["kv_audit"][k] for k in ("compared", "compared_state")} == {
        "compared": 1, "compared_state": 0}
    assert any("1 mismatching digests in 1 requests" in n.text for n in bundle.notes)

    empty = tmp_path / "empty"
    empty.mkdir()
    verdict = cross_replica_round(Pair(empty), Namespaces("run", "node"),  # type: ignore[arg-type]
                                  ResultSink("node", Bundle()), cases, 1, 0.0)
    assert not verdict.ok and "VOID: the audit hook never saw replica A or B" in verdict.message


def test_a_connector_without_the_entry_points_is_recorded_unsupported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Version drift: a future LMCache whose connector lacks a wrapped method leaves an
    'unsupported' record (the audit is then VOID, naming it), and an adapter without the
    attributes the digests need does the same at registration."""
    import sys
    import types

    from pytest_sharedkv.engine_hooks import kv_audit_hook
    class Renamed:  # no wait_for_save / get_finished
        def register_kv_caches(self, kv: Any) -> None:
            return None

    class NoAdapterAttrs:
        worker_adapter = object()

        def register_kv_caches(self, kv: Any) -> None:
            return None

        wait_for_save = start_load_kv = get_finished = register_kv_caches

    module = types.ModuleType("lmcache.integration.vllm.lmcache_mp_connector")
    module.LMCacheMPConnector = Renamed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setenv(kv_audit_hook.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(kv_audit_hook.ROLE_ENV, "A")
    finder = kv_audit_hook.install()
    assert finder is not None
    sys.meta_path.remove(finder)
    report = kv_audit.compare(kv_audit.read_records(tmp_path))
    assert report.void is not None and "LMCacheMPConnector.wait_for_save" in report.void

    patched = kv_audit_hook.patch_connector(NoAdapterAttrs, kv_audit_hook.AuditLog(
        tmp_path / "b", "B"))
    patched().register_kv_caches({})
    records = kv_audit.read_records(tmp_path / "b")
    assert records[0]["kind"] == "unsupported" and "kv_caches" in records[0]["missing"]


def test_requests_resumed_from_unkept_state_are_counted_per_size() -> None:
    """Issue 48 item 6: per size, the cross-replica requests that resumed a recurrent layer
    from a chunk A stored without its state; unknown where the audit proves nothing."""
    from pytest_sharedkv.stack.kv_audit import AuditReport, compare, unkept_by_size

    def rec(kind: str, role: str, request: str, key: str, layer: str, recurrent: bool
            ) -> dict[str, object]:
        return {"kind": kind, "role": role, "request": request, "chunk": 0, "key": key,
                "group": 1 if recurrent else 0, "layer": layer, "recurrent": recurrent,
                "digest": "d"}

    records: list[dict[str, object]] = [{"kind": "registered", "role": r} for r in "AB"]
    for request in ("8k-000", "8k-001", "32k-000"):
        records.append(rec("store", "A", request, f"k-{request}", "attn", False))
        records.append(rec("load", "B", request, f"k-{request}", "attn", False))
        if request != "8k-001":  # B resumed its state layer of a chunk A kept no state of
            records.append(rec("load", "B", request, f"k-{request}", "gdn", True))
    report = compare(records)
    sizes = {"8k-000": "8k", "8k-001": "8k", "32k-000": "32k"}
    assert unkept_by_size(report, sizes, ["8k", "32k", "128k"]) == {
        "8k": 1, "32k": 1, "128k": 0}
    assert unkept_by_size(None, sizes, ["8k"]) == {"8k": None}
    assert unkept_by_size(AuditReport(), sizes, ["8k"]) == {"8k": None}  # VOID: unknown


def test_b_recurrent_loads_carry_the_state_it_resumed_from(tmp_path: Path) -> None:
    """Issue 48: where vLLM registered a recurrent layer as [conv_state, ssm_state] (vLLM
    0.26's layout, indexed by block), B's load record of that layer carries a summary of
    the state block it loaded, in transformers' layout, for the state oracle; A's store
    records and attention layers carry none."""
    from pytest_sharedkv.engine_hooks.kv_audit_hook import AuditLog, patch_connector
    from pytest_sharedkv.engine_hooks.state_summary import canonical, summary_of_tensors

    g = torch.Generator().manual_seed(3)
    conv, ssm = torch.randn(64, 3, 16, generator=g), torch.randn(64, 2, 8, 4, generator=g)
    cls = patch_connector(connector_class(), AuditLog(tmp_path, "B"))
    b = cls(kv_tensors(2))
    b.register_kv_caches({**b.worker_adapter.kv_caches, "layers.2": [conv, ssm]})
    rid = "cmpl-sharedkv.3k-001.cross.B-0-cd34"
    b.metadata = Metadata([Meta(rid, "RETRIEVE", Op(TOKENS, [list(range(20, 28)),
                                                             [0] * 7 + [29]], 0, 4 * CHUNK))])
    b.start_load_kv(None)
    b.finished = {rid}
    b.get_finished(set())
    loads = [r for r in kv_audit.read_records(tmp_path) if r.get("kind") == "load"]
    [state] = [r for r in loads if r["layer"] == "layers.2"]
    assert state["recurrent"] and state["chunk"] == 3
    assert state["state"] == summary_of_tensors(list(canonical(conv[29], ssm[29])))
    assert all("state" not in r for r in loads if r["layer"] != "layers.2")
