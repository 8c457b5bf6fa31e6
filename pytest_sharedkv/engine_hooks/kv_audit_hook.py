"""In-engine KV audit: digests of the KV each replica stores and loads, where the engine
itself produces and consumes it, in the launched vLLM processes.

Answers see corrupted KV only where the model is sensitive to it, and the transfer
provider checks bytes outside the engines; a misread that is symmetric between store and
retrieve shows only in the bytes an engine consumes. So, per LMCache chunk, KV group and
layer (attention pages and Gated DeltaNet conv/recurrent state alike, whatever LMCache
moves for that group), replica A digests the pages a STORE op names right after the
forward pass that wrote them (``wait_for_save``: on the engine's stream, behind that
pass), and replica B digests the pages a RETRIEVE op filled once the connector reports
the load finished (``get_finished``), before the scheduler lets any forward pass read
them. Chunks are keyed by a hash of the request's cache salt and token ids up to the
chunk's end, which both processes compute alike.

Ordering: the digests only read pages, on the engine's current stream, after the
engine's own ordering point (A: its forward pass; B: the finished-load report the engine
waits for anyway); nothing here waits on LMCache's streams or events, so the LMCache
server's copies run exactly as they would without the audit (the lazy allocator's race
lives between the server's staging kernel and its unordered cudaMemcpy, in the server).

Each process appends JSON lines to ``$SHAREDKV_KV_AUDIT_DIR/kv-audit-<role>-<pid>.jsonl``;
the hook never raises into the engine (a failure becomes an ``error`` record).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import post_import

DIR_ENV = "SHAREDKV_KV_AUDIT_DIR"
ROLE_ENV = "SHAREDKV_KV_AUDIT_ROLE"  # "A" or "B"
TAG = "kv-audit"
NULL_BLOCK = 0  # vLLM's null block (LMCache's default null_block_id): no state there

# The entry points, read from LMCache 0.5.6 (lmcache/integration/vllm/
# lmcache_mp_connector.py and vllm_multi_process_adapter.py) as vLLM 0.26.0 loads them:
# vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py prefers LMCache's
# own LMCacheMPConnector class over its builtin copy.
TARGETS = {"lmcache.integration.vllm.lmcache_mp_connector": ["LMCacheMPConnector"]}
ENTRY_POINTS: tuple[tuple[str, str, str], ...] = (
    ("LMCacheMPConnector.register_kv_caches", "the KV tensors and LMCache's KV groups",
     "LMCache 0.5.6 / vLLM 0.26.0"),
    ("LMCacheMPConnector.wait_for_save", "A: STORE ops, after the forward pass",
     "LMCache 0.5.6 / vLLM 0.26.0"),
    ("LMCacheMPConnector.start_load_kv", "B: RETRIEVE ops as they are submitted",
     "LMCache 0.5.6 / vLLM 0.26.0"),
    ("LMCacheMPConnector.get_finished", "B: loads reported finished, before consumption",
     "LMCache 0.5.6 / vLLM 0.26.0"),
)
METHODS = tuple(name.split(".")[1] for name, _, _ in ENTRY_POINTS)
# where the hook sees a replica register its KV caches (its "registered" record): the MP
# connector's method, so a replica whose connector never calls it is never audited
REGISTRATION = f"{next(iter(TARGETS))}:{ENTRY_POINTS[0][0]}"
# What the worker adapter must expose (introspected at registration; missing = VOID)
ADAPTER_NEEDS = ("kv_caches", "engine_group_infos", "lmcache_tokens_per_chunk",
                 "_block_ids_per_group")


class AuditLog:
    """One JSON-lines file per process, appended and flushed record by record."""

    def __init__(self, directory: Path, role: str) -> None:
        self.path = directory / f"kv-audit-{role}-{os.getpid()}.jsonl"
        self.role = role
        self._lock = threading.Lock()

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        lines = "".join(json.dumps({"role": self.role, **r}, sort_keys=True) + "\n"
                        for r in records)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(lines)


def chunk_keys(salt: str, token_ids: Sequence[int], chunk: int, first: int, count: int
               ) -> list[str]:
    """Keys of chunks FIRST..FIRST+COUNT-1: a hash of the salt and every token id up to
    each chunk's end (one pass over the tokens)."""
    h = hashlib.sha256(salt.encode() + b"\0")
    keys = []
    for index in range(first + count):
        h.update(array("q", token_ids[index * chunk:(index + 1) * chunk]).tobytes())
        if index >= first:
            keys.append(h.copy().hexdigest()[:32])
    return keys


def block_dim(shape: Sequence[int]) -> int:
    """Which dimension of a registered KV tensor indexes blocks: the first, unless the
    layout leads with K/V (2, NB, ...)."""
    return 1 if len(shape) > 1 and shape[0] == 2 and shape[1] != 2 else 0


def digest_rows(rows: Any) -> str:
    """blake2b-128 of a host uint8 array's bytes."""
    return hashlib.blake2b(rows.tobytes(), digest_size=16).hexdigest()


def gather(tensor: Any, blocks: Sequence[int]) -> Any:
    """The blocks' bytes on the host, one row per block (reads on the current stream)."""
    import torch

    dim = block_dim(tuple(tensor.shape))
    index = torch.tensor(list(blocks), dtype=torch.long, device=tensor.device)
    part = tensor.index_select(dim, index)
    if dim:
        part = part.movedim(dim, 0)
    part = part.contiguous()
    return part.view(torch.uint8).reshape(len(blocks), -1).cpu().numpy()


# Set on the connector at registration: the layers vLLM registered as a list of state
# tensors ([conv_state, ssm_state]: a Mamba/GDN layer). LMCache 0.5.6 flags such a group
# ``recurrent_state``; 0.5.3 re-views the page as a one-block sliding window and flags
# nothing, so the registration is what says which digests are recurrent state.
STATE_LAYERS = "_sharedkv_state_layers"
# ... and those lists themselves ([conv_state, ssm_state], indexed by block): B's load
# records of a recurrent layer carry a summary of the state it resumed from (the chunk's
# last non-null block), in transformers' layout (state_summary.canonical), which the state
# oracle judges. Read from vLLM 0.26's source (MambaStateShapeCalculator); not yet run on
# a GPU.
STATE_TENSORS = "_sharedkv_state_tensors"


def state_tensors(kv_caches: Any) -> dict[str, list[Any]]:
    items = kv_caches.items() if hasattr(kv_caches, "items") else ()
    return {str(n): list(t) for n, t in items if isinstance(t, (list, tuple)) and len(t) == 2}


def state_summary(tensors: Sequence[Any], block: int) -> dict[str, Any]:
    """The state summary of one block of a recurrent layer's (conv, ssm) tensors."""
    from pytest_sharedkv.engine_hooks.state_summary import canonical, summary_of_tensors

    conv, ssm = canonical(tensors[0][block], tensors[1][block])
    return summary_of_tensors([conv, ssm])


def state_layer_names(kv_caches: Any) -> frozenset[str]:
    """Layers vLLM registered as a list of tensors (a recurrent layer's state)."""
    items = kv_caches.items() if hasattr(kv_caches, "items") else ()
    return frozenset(str(n) for n, t in items if isinstance(t, (list, tuple)))


def is_recurrent(info: Any, layer_names: Sequence[str], state_layers: frozenset[str]
                 ) -> bool:
    """Whether a KV group holds recurrent state: LMCache's flag where it has one, else
    the registration's list-of-tensors layers."""
    return bool(getattr(info, "recurrent_state", False)) or any(
        n in state_layers for n in layer_names)


def audit_op(connector: Any, direction: str, request_id: str, op: Any, salt: str
             ) -> list[dict[str, Any]]:
    """Digest records for every chunk, group and layer of one STORE or RETRIEVE op."""
    started = time.perf_counter()
    adapter = connector.worker_adapter
    chunk = int(adapter.lmcache_tokens_per_chunk)
    groups = list(adapter.engine_group_infos)
    per_group = adapter._block_ids_per_group(op)
    tensors = list(adapter.kv_caches.items())
    state_layers: frozenset[str] = getattr(connector, STATE_LAYERS, frozenset())
    states: dict[str, list[Any]] = getattr(connector, STATE_TENSORS, {})
    count = (int(op.end) - int(op.start)) // chunk
    first = int(op.start) // chunk
    skip = int(getattr(op, "skip_first_n_tokens", 0) or 0) if direction == "load" else 0
    keys = chunk_keys(salt, list(op.token_ids), chunk, first, count)
    records: list[dict[str, Any]] = []
    for g, (info, blocks) in enumerate(zip(groups, per_group, strict=False)):
        tpb = int(getattr(info, "tokens_per_block", 0) or 0)
        bpc = chunk // tpb if tpb else (len(blocks) // count if count else 0)
        if count == 0 or bpc <= 0 or len(blocks) < count * bpc:
            records.append({"kind": "skipped-group", "request": request_id, "group": g,
                            "why": f"{len(blocks)} block ids for {count} chunks of {bpc}"})
            continue
        flat = list(blocks[:count * bpc])
        recurrent = is_recurrent(info, [tensors[i][0] for i in info.layer_indices],
                                 state_layers)
        for layer_index in info.layer_indices:
            name, tensor = tensors[layer_index]
            rows = gather(tensor, flat)
            for i in range(count):
                if first * chunk + i * chunk < int(op.start) + skip:
                    continue  # the server skipped these tokens: B's own prefix cache
                real = [j for j in range(i * bpc, (i + 1) * bpc) if flat[j] != NULL_BLOCK]
                if not real:
                    continue  # align-mode recurrent state: only some chunks hold any
                record = {
                    "kind": direction, "request": request_id, "chunk": first + i,
                    "key": keys[i], "group": g, "layer": name,
                    "recurrent": recurrent,
                    "digest": digest_rows(rows[real])}
                if direction == "load" and recurrent and name in states:
                    try:  # a layout this reading does not know loses the summary alone
                        record["state"] = state_summary(states[name], flat[real[-1]])
                    except Exception as exc:
                        record["state_error"] = repr(exc)[:200]
                records.append(record)
    records.append({"kind": "cost", "direction": direction, "request": request_id,
                    "tokens": count * chunk, "seconds": time.perf_counter() - started})
    return records


def _op_audit(connector: Any, direction: str, request_id: str, op: Any, salt: str
              ) -> Callable[[], list[dict[str, Any]]]:
    return lambda: audit_op(connector, direction, request_id, op, salt)


def _requests(connector: Any, direction: str) -> list[Any]:
    metadata = connector._get_connector_metadata()
    return [m for m in getattr(metadata, "requests", ()) if m.direction == direction]


def patch_connector(cls: Any, log: AuditLog) -> Any:
    """Wrap the connector class's four entry points in place; returns the class."""
    pending: dict[int, dict[str, tuple[Any, str]]] = {}  # id(connector) -> RETRIEVE ops

    def guarded(where: str, work: Callable[[], list[dict[str, Any]]]) -> None:
        try:
            records = work()
        except Exception as exc:  # the audit must never break the engine
            records = [{"kind": "error", "where": where, "error": repr(exc)[:500]}]
        if records:
            log.write(records)

    orig_register = cls.register_kv_caches
    orig_save = cls.wait_for_save
    orig_load = cls.start_load_kv
    orig_finished = cls.get_finished

    def register_kv_caches(self: Any, kv_caches: Any) -> Any:
        state = state_layer_names(kv_caches)  # before LMCache re-views them
        tensors = state_tensors(kv_caches)
        result = orig_register(self, kv_caches)

        def registered() -> list[dict[str, Any]]:
            adapter: Any = getattr(self, "worker_adapter", None)
            missing = [n for n in ADAPTER_NEEDS if not hasattr(adapter, n)]
            if missing:
                return [{"kind": "unsupported", "missing": missing}]
            setattr(self, STATE_LAYERS, state)
            setattr(self, STATE_TENSORS, tensors)
            names = list(adapter.kv_caches)
            groups = [{"layers": list(g.layer_indices),
                       "tokens_per_block": int(getattr(g, "tokens_per_block", 0) or 0),
                       "recurrent": is_recurrent(
                           g, [names[i] for i in g.layer_indices if i < len(names)], state)}
                      for g in adapter.engine_group_infos]
            return [{"kind": "registered", "groups": groups,
                     "chunk": int(adapter.lmcache_tokens_per_chunk),
                     "tensors": {n: list(t.shape) for n, t in adapter.kv_caches.items()}}]

        guarded("register_kv_caches", registered)
        return result

    def wait_for_save(self: Any) -> Any:
        stores: list[Any] = []

        def collect() -> list[dict[str, Any]]:
            stores.extend(_requests(self, "STORE"))
            return []

        guarded("wait_for_save", collect)
        result = orig_save(self)
        for meta in stores:
            guarded("wait_for_save", _op_audit(self, "store", meta.request_id, meta.op,
                                               getattr(meta, "cache_salt", "") or ""))
        return result

    def start_load_kv(self: Any, forward_context: Any, **kwargs: Any) -> Any:
        def remember() -> list[dict[str, Any]]:
            ops = pending.setdefault(id(self), {})
            for meta in _requests(self, "RETRIEVE"):
                ops[meta.request_id] = (meta.op, getattr(meta, "cache_salt", "") or "")
            return []

        guarded("start_load_kv", remember)
        return orig_load(self, forward_context, **kwargs)

    def get_finished(self: Any, finished_req_ids: Any) -> Any:
        result = orig_finished(self, finished_req_ids)
        recving = result[1] if isinstance(result, tuple) and len(result) > 1 else None
        ops = pending.get(id(self), {})
        for request_id in recving or ():
            entry = ops.pop(request_id, None)
            if entry is not None:
                guarded("get_finished", _op_audit(self, "load", request_id, *entry))
        return result

    cls.register_kv_caches = register_kv_caches
    cls.wait_for_save = wait_for_save
    cls.start_load_kv = start_load_kv
    cls.get_finished = get_finished
    return cls


def install() -> post_import.PostImportFinder | None:
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    log = AuditLog(Path(directory), os.environ.get(ROLE_ENV, "?"))
    log.write([{"kind": "installed", "pid": os.getpid()}])

    def wrap(name: str, cls: Any) -> Any:
        missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
        if missing:
            log.write([{"kind": "unsupported", "missing": [f"{name}.{m}" for m in missing]}])
            return cls
        return patch_connector(cls, log)

    finder = post_import.install(TARGETS, wrap, TAG, verb="auditing KV in")
    print(f"sharedkv-{TAG}: KV audit on (log {log.path})", file=sys.stderr, flush=True)
    return finder
