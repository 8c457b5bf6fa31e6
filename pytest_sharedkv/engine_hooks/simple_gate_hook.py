"""The service tier's sensitivity gate on vLLM's ``SimpleCPUOffloadConnector`` (vLLM
#45704's path, ``--sharedkv-native-connector simple``): inside replica B, while the control
file names chunk K, the GPU blocks that a load from B's own CPU tier fills with tokens
[K * chunk, (K + 1) * chunk) of a request are zeroed once that load's copy is done.

``native_gate_hook`` does this for the ``OffloadingConnector``, whose load carries a spec
with each group's first block index. This connector's worker gets flat block lists and no
request (its metadata says so), so the tokens a loaded block holds come from the scheduler
side of the same process: a sibling hook, sharing ``corrupt_hook.arm``, the log and
``native_gate_hook``'s groups. Read from vLLM 0.26.0's source; on stand-ins of these classes in
``tests/test_simple_gate_hook.py``, and on the H200 (the gate proven in three runs,
``fixtures/lmcache/h200/native-simple-vllm-0.26.0*``).

What it depends on (vLLM 0.26.0; ``v1/simple_kv_offload/`` is absent from the reference
checkout here, so its lines are those of the public copy whose lines match the field
report's citations, worker.py:235-246 and copy_backend.py:125-126):

* ``distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py``:
  ``SimpleCPUOffloadConnector.__init__(self, vllm_config, role, kv_cache_config)`` (:48-116;
  one instance per role, the SCHEDULER's makes the manager :98-112, the WORKER's the worker
  :113-116): the KV-cache groups (each group's ``kv_cache_spec``: block size, attention or
  Mamba state). ``update_state_after_alloc(self, request, blocks, num_external_tokens)``
  (:191-200), which the scheduler calls with the request's whole block table
  (``v1/core/sched/scheduler.py:962-967``, ``kv_cache_manager.get_blocks(request_id)``;
  ``KVCacheBlocks.get_block_ids()``, ``v1/core/kv_cache_manager.py:73-89``: per group, its
  i-th block holds the request's tokens [i * B_g, (i + 1) * B_g)). The manager's load pairs
  are that table's own entries (``v1/simple_kv_offload/manager.py``
  ``update_state_after_alloc``: ``group_gpu_ids[gpu_ext_start + i]``), and its
  ``build_connector_meta`` names each load event's requests (``load_event_to_reqs``).
  ``bind_connector_metadata(self, connector_metadata)`` (:124-131) hands that metadata to
  the worker: ``load_event``, ``load_gpu_blocks``, ``load_event_to_reqs``.
* ``config/parallel.py:927-928``: one GPU per replica runs the ``uni`` executor, so the
  scheduler's connector and the worker's live in EngineCore's one process and this hook's
  state is seen by both. Elsewhere a load finds no request table and zeroes nothing (said
  on stderr): the gate is VOID, never falsely proven.
* ``v1/simple_kv_offload/worker.py``: ``get_finished`` launches the step's load
  (:226-234, ``self._backend.launch_copy(load_cpu_blocks, load_gpu_blocks, is_store=False,
  event_idx=load_event, events_list=self._load_events)``) before it polls (:251-259): a
  load is reported done (``finished_recving``, after which its requests run) only once its
  event, polled by ``_poll_stream_events`` (:299-312), has completed. ``register_kv_caches``
  hands the backend its GPU caches (:180-186): an int8 ``[num_blocks, page bytes]`` view of
  each storage, or of each K/V segment (:131, :137), a block id one row in every view.
* ``v1/simple_kv_offload/copy_backend.py``: ``DmaCopyBackend.init(self, gpu_caches,
  cpu_caches, device, load_stream, store_stream)`` (:37-69) and ``launch_copy(self,
  src_blocks, dst_blocks, is_store, event_idx, events_list, wait_event=None)`` (:71-92),
  which queues the copy for ``_copy_loop``'s thread (:104-130): it copies on the load
  stream (:127), then records an event and appends ``(event_idx, event)`` to
  ``events_list`` (:128-130).

Ordering: after the wrapped ``launch_copy`` queues a load, the hook waits until the copy
thread has appended that load's event, synchronizes it (the copy is done), zeroes the rows
of the named chunk's blocks in every GPU cache view on the current stream and synchronizes
that stream, all before ``get_finished`` polls: the load cannot be reported done, nor its
requests run, before the blocks are zeroed. Only attention groups are zeroed (a state
block is the state after its last token, not its tokens' KV); a block is zeroed whole (a
larger block than the chunk is said on stderr); the null block (id 0) never; only blocks
this load writes. Logs as ``corrupt_hook`` does (one line per zeroed block, that it loaded,
each method it wrapped: ``NEEDED``), so ``service.sensitivity.run_gate`` reads it
unchanged; an error inside the hook is printed and disables it (the engine never sees
it). Loaded through ``inject/sitecustomize.py`` when ``SHAREDKV_SIMPLE_GATE_CONTROL`` is
set. Standard library only at import.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import corrupt_hook, post_import
from pytest_sharedkv.engine_hooks.native_gate_hook import (
    NULL_BLOCK,
    Group,
    Zeroed,
    groups_of,
    synchronize,
    zeroed,
)

CONTROL_ENV = "SHAREDKV_SIMPLE_GATE_CONTROL"  # the control file the suite writes
LOG_ENV = "SHAREDKV_SIMPLE_GATE_LOG"  # one line per zeroed block (corrupt_hook's form)
CHUNK_ENV = "SHAREDKV_SIMPLE_GATE_CHUNK"  # the corpus's chunk, in tokens
TAG = "simple-gate"
CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector"
CONNECTOR = "SimpleCPUOffloadConnector"
BACKEND_MODULE = "vllm.v1.simple_kv_offload.copy_backend"
BACKEND = "DmaCopyBackend"
TARGETS = {CONNECTOR_MODULE: [CONNECTOR], BACKEND_MODULE: [BACKEND]}
METHODS = {CONNECTOR: ("__init__", "update_state_after_alloc", "bind_connector_metadata"),
           BACKEND: ("init", "launch_copy")}
# what the gate needs wrapped, as the log names them: all, or it cannot zero anything
NEEDED = tuple(f"{module}:{cls}.{method}" for module, classes in TARGETS.items()
               for cls in classes for method in METHODS[cls])
KEPT = 4096  # request tables and load events kept (a request whose load never came)
WAIT_S = 120.0  # for the copy thread to publish a load's event


class _State:
    """This process's view, filled by the wrapped methods: the groups, each request's
    block table, each load event's requests, the GPU caches; and whether an error
    disabled the hook."""

    def __init__(self) -> None:
        self.groups: list[Group] | None = None
        self.tables: OrderedDict[str, tuple[list[int], ...]] = OrderedDict()
        self.loads: OrderedDict[int, list[str]] = OrderedDict()
        self.gpu_caches: list[Any] | None = None
        self.disabled = False
        self.said: set[str] = set()

    def say(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            print(f"sharedkv-{TAG}: {line}", file=sys.stderr, flush=True)

    def disable(self, what: str, exc: BaseException) -> None:
        self.disabled = True
        self.say(f"disabled: could not {what}: {type(exc).__name__}: {exc}")


STATE = _State()


def _keep(store: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > KEPT:
        store.popitem(last=False)


def blocks_to_zero(table: Sequence[Sequence[int]], groups: Sequence[Group],
                   chunks: Iterable[int], chunk_size: int, loaded: Iterable[int]
                   ) -> list[Zeroed]:
    """The blocks of one request's block TABLE (per group, its GPU block ids in token
    order) that hold tokens of the named CHUNKS (of CHUNK_SIZE tokens) and that this load
    writes (LOADED, its GPU block ids): attention groups only, the null block never."""
    if len(table) != len(groups):
        raise ValueError(f"a block table of {len(table)} groups does not match the "
                         f"{len(groups)} KV-cache groups")
    named = sorted(set(chunks))
    written = {int(b) for b in loaded}
    out: list[Zeroed] = []
    for g, (ids, group) in enumerate(zip(table, groups, strict=True)):
        if not group.attention:
            continue
        per = group.tokens_per_block
        for i, block_id in enumerate(int(b) for b in ids):
            lo = i * per
            for chunk in named:
                if block_id != NULL_BLOCK and block_id in written \
                        and lo < (chunk + 1) * chunk_size and chunk * chunk_size < lo + per:
                    out.append(Zeroed(g, chunk, block_id, lo, per))
    return out


def zero_rows(caches: Sequence[Any], blocks: Sequence[Zeroed], log: str | None,
              chunk_size: int) -> None:
    """Zero each block's row in every GPU cache view (the bytes the load wrote) and log
    it; then synchronize the stream it ran on."""
    for block in blocks:
        nbytes = 0
        for cache in caches:
            row = cache[block.block_id]
            row.zero_()
            nbytes += int(row.numel()) * int(row.element_size())
        zeroed(block, nbytes, log, chunk_size, STATE.say)
    synchronize(caches)


def published(events_list: list[Any], event_idx: int, wait_s: float = WAIT_S) -> Any:
    """The event the copy thread appended for EVENT_IDX, once it has (None after WAIT_S)."""
    deadline = time.monotonic() + wait_s
    while True:
        for index, event in list(events_list):
            if index == event_idx:
                return event
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0005)


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str,
              default: Any = None) -> Any:
    return kwargs[name] if name in kwargs else args[index] if len(args) > index else default


def zeroing_load(control: Path, log: str | None, chunk_size: int,
                 fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (``DmaCopyBackend.launch_copy``) that, for a load while the control file names
    chunks, waits for the copy it queued and zeroes the named chunks' blocks."""

    @functools.wraps(fn)
    def launch_copy(self: Any, src_blocks: Any, dst_blocks: Any, *args: Any,
                    **kwargs: Any) -> Any:
        queued = fn(self, src_blocks, dst_blocks, *args, **kwargs)
        if STATE.disabled or _argument(args, kwargs, 0, "is_store", True):
            return queued
        named = corrupt_hook.chunks_to_zero(control)
        if not named:
            return queued
        event_idx = _argument(args, kwargs, 1, "event_idx")
        try:
            requests = STATE.loads.pop(event_idx, None)
            if STATE.groups is None or STATE.gpu_caches is None or requests is None:
                STATE.say(f"a load (event {event_idx}) came without the KV-cache groups, the "
                          "GPU caches or its requests (not the uni executor's one process?): "
                          "nothing zeroed")
                return queued
            blocks: list[Zeroed] = []
            for request in requests:
                table = STATE.tables.pop(request, None)
                if table is None:
                    STATE.say(f"request {request} was loaded without its block table: "
                              "nothing of it zeroed")
                    continue
                blocks += blocks_to_zero(table, STATE.groups, named, chunk_size, dst_blocks)
            if blocks:
                event = published(_argument(args, kwargs, 2, "events_list"), event_idx)
                if event is None:
                    raise TimeoutError(f"no event of load {event_idx} after {WAIT_S:g} s")
                event.synchronize()  # the copy is done before anything is zeroed
                zero_rows(STATE.gpu_caches, blocks, log, chunk_size)
        except Exception as exc:  # report, disable, never break the engine
            STATE.disable(f"zero a load of event {event_idx}", exc)
        return queued

    return launch_copy


def keeping_caches(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (``DmaCopyBackend.init``) that then keeps the GPU caches a load writes."""

    @functools.wraps(fn)
    def init(self: Any, gpu_caches: Any, *args: Any, **kwargs: Any) -> Any:
        done = fn(self, gpu_caches, *args, **kwargs)
        try:
            STATE.gpu_caches = list(gpu_caches.values())
        except Exception as exc:
            STATE.disable("read the GPU caches", exc)
        return done

    return init


def reading_groups(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (the connector's ``__init__``) that then keeps its KV-cache groups (either
    role's: they are the same config)."""

    @functools.wraps(fn)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        fn(self, *args, **kwargs)
        try:
            config = _argument(args, kwargs, 2, "kv_cache_config")
            vllm_config = _argument(args, kwargs, 0, "vllm_config")
            parallel = getattr(vllm_config, "parallel_config", None)
            cp = int(getattr(parallel, "decode_context_parallel_size", 1) or 1) * int(
                getattr(parallel, "prefill_context_parallel_size", 1) or 1)
            if cp != 1:
                raise ValueError(f"context parallel size {cp}: a block's tokens are not "
                                 "its group's block size")
            if config is not None and STATE.groups is None:
                STATE.groups = groups_of(config)
                STATE.say("KV-cache groups: " + ", ".join(
                    f"{g.tokens_per_block}-token {'attention' if g.attention else 'state'}"
                    for g in STATE.groups))
        except Exception as exc:  # report, disable, never break the engine
            STATE.disable("read the KV-cache groups", exc)

    return __init__


def keeping_tables(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (the connector's ``update_state_after_alloc``) that then keeps the block table
    of a request that loads from the CPU tier."""

    @functools.wraps(fn)
    def update_state_after_alloc(self: Any, request: Any, blocks: Any,
                                 num_external_tokens: int, *args: Any, **kwargs: Any) -> Any:
        done = fn(self, request, blocks, num_external_tokens, *args, **kwargs)
        if num_external_tokens and not STATE.disabled:
            try:
                table = tuple(list(ids) for ids in blocks.get_block_ids())
                _keep(STATE.tables, str(request.request_id), table)
            except Exception as exc:
                STATE.disable("read a request's block table", exc)
        return done

    return update_state_after_alloc


def keeping_loads(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (the connector's ``bind_connector_metadata``) that then keeps the requests of
    the step's load event."""

    @functools.wraps(fn)
    def bind_connector_metadata(self: Any, connector_metadata: Any, *args: Any,
                                **kwargs: Any) -> Any:
        done = fn(self, connector_metadata, *args, **kwargs)
        try:
            event = int(getattr(connector_metadata, "load_event", -1))
            if event >= 0 and not STATE.disabled:
                requests = connector_metadata.load_event_to_reqs.get(event) or []
                _keep(STATE.loads, event, [str(r) for r in requests])
        except Exception as exc:
            STATE.disable("read a step's load", exc)
        return done

    return bind_connector_metadata


WRAPPERS: dict[str, Callable[..., Callable[..., Any]]] = {
    "__init__": reading_groups, "update_state_after_alloc": keeping_tables,
    "bind_connector_metadata": keeping_loads, "init": keeping_caches}


def wrapper(control: Path, log: str | None, chunk_size: int) -> post_import.Wrapper:
    """Wraps a target class's methods in place (the class itself is kept)."""

    def wrap(name: str, cls: Any) -> Any:
        if not isinstance(cls, type):
            return cls
        for method in METHODS.get(name.rpartition(":")[2], ()):
            fn = cls.__dict__.get(method)
            if not callable(fn):
                continue
            setattr(cls, method, zeroing_load(control, log, chunk_size, fn)
                    if method == "launch_copy" else WRAPPERS[method](fn))
            corrupt_hook.log_wrapped(log, f"{name}.{method}")
        return cls

    return wrap


def install() -> post_import.PostImportFinder | None:
    return corrupt_hook.arm(TAG, TARGETS, wrapper, CONTROL_ENV, LOG_ENV,
                            verb="zeroing named chunks of CPU-tier loads in", chunk_env=CHUNK_ENV,
                            where=" in this replica")
