"""Round trips through LMCache's real transfer code, replica A -> B (0.5.3 and 0.5.6 alike:
names that moved between releases are found through ``host.lmcache_api``).

Paths (all LMCache code; nothing here copies KV bytes itself):

* ``kernel-fallback`` / ``kernel-native``: ``multi_layer_block_kv_transfer``, the kernel
  every multiprocess path ends in, as the torch fallback and as the compiled
  ``lmcache.cuda_ops`` kernel (when it loaded), on tensors.
* ``engine-driven``: ``gather_paged_kv_to_cpu`` / ``scatter_cpu_to_paged_kv``, the MP
  worker path (single KV group only).
* ``server`` / ``server-separate``: the LMCache-driven MP server path: ``CPUCacheContext``,
  kernel and object groups, ``transfer_kv_per_object_group`` (the only path that moves
  hybrid GDN + attention KV), with one object group or one per kind.

Hybrid models go through LMCache's own vLLM registration first
(``apply_kv_cache_group_edits``, ``create_engine_group_infos_from_vllm``), exactly as
``LMCacheMPConnector.register_kv_caches`` does.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass, field
from math import prod
from typing import Any

import torch

from pytest_sharedkv.host.lmcache_api import direction, known_keywords
from pytest_sharedkv.layouts.build import (
    Replica,
    hybrid_config,
    hybrid_replica,
    plain_replica,
    torch_dtype,
)
from pytest_sharedkv.layouts.specs import LayoutSpec
from pytest_sharedkv.packed_page.check import CheckResult, check_round_trip
from pytest_sharedkv.packed_page.vllm_interface import kv_cache_interface

PATHS = ("kernel-fallback", "kernel-native", "engine-driven", "server", "server-separate")
BLOCKS_PER_CHUNK = 2
NUM_CHUNKS = 3
SEED_A, SEED_B = 11, 22

# Combinations LMCache does not support by design: a test that meets LMCache's refusal is
# an xfail with this reason and LMCache's own message (never a silent pass).
HYBRID_ONLY_SERVER = ("LMCache moves hybrid (Gated DeltaNet + attention) KV only through "
                      "its server-side object-group path")


class Unsupported(Exception):
    """LMCache refused this layout on this path (the reason carries LMCache's message)."""


@dataclass
class Trip:
    check: CheckResult
    facts: list[str] = field(default_factory=list)


COMPILED_TAKES_CUDA_ONLY = (
    "with its compiled kernels bound, LMCache sends CPU-resident KV through them and they "
    "take CUDA tensors only (a host without the compiled build runs this path on the torch "
    "fallback; no GPU deployment keeps its KV on the CPU)")
# Refusals some releases make and others do not (0.5.3 on every CPU path through its
# kernels, 0.5.6 on its server path only): a cell that passes there is no news.
MAY_PASS = frozenset({COMPILED_TAKES_CUDA_ONLY})


def expected_unsupported(spec: LayoutSpec, path: str, device: str = "cuda",
                         compiled: bool = False) -> str | None:
    """Why LMCache refuses this cell by design or by a known limitation, else None."""
    if spec.family == "hybrid" and path in ("kernel-fallback", "kernel-native", "engine-driven"):
        return HYBRID_ONLY_SERVER
    if compiled and device == "cpu" and path != "kernel-fallback":
        return COMPILED_TAKES_CUDA_ONLY
    return None


def _quiet_lmcache() -> None:
    import logging

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.WARNING)


def block_ids(num_blocks: int, count: int, seed: int) -> tuple[list[int], list[int]]:
    """Distinct source ids in A and destination ids in B, never the same id at one position."""
    rng = random.Random(seed)
    a = rng.sample(range(num_blocks), count)
    while True:
        b = rng.sample(range(num_blocks), count)
        if all(x != y for x, y in zip(a, b, strict=True)):
            return a, b


def _release(objects: list[Any]) -> None:
    """Hand the memory objects back the way LMCache's own callers do (no GC warnings)."""
    for obj in objects:
        obj.ref_count_down()


def _allocate(shapes: Any, dtypes: Any, count: int, device: torch.device) -> list[Any]:
    from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator

    shape_list = shapes if isinstance(shapes, list) else [shapes]
    dtype_list = dtypes if isinstance(dtypes, list) else [dtypes]
    size = sum(prod(s) * d.itemsize for s, d in zip(shape_list, dtype_list, strict=True))
    pin = device.type == "cuda"
    allocator = TensorMemoryAllocator(
        torch.empty(count * (size + 4096), dtype=torch.uint8, pin_memory=pin))
    objects = [allocator.allocate(shapes, dtypes) for _ in range(count)]
    if any(o is None for o in objects):
        raise RuntimeError("TensorMemoryAllocator could not hold the round trip's objects")
    return objects


def _kernel(path: str) -> Any:
    if path == "kernel-fallback":
        from lmcache.v1.platform import torch_ops

        return torch_ops.multi_layer_block_kv_transfer
    import lmcache

    from pytest_sharedkv.host.lmcache_status import device_ops

    ops = device_ops(lmcache)
    if ops is None or "multi_layer_block_kv_transfer" not in vars(ops):
        raise Unsupported("the compiled lmcache.cuda_ops kernels are not bound here "
                          "(LMCache runs its torch fallback)")
    return ops.multi_layer_block_kv_transfer


MAX_OBJECTS_PER_CALL = 4  # the CUDA kernel's object limit (transfer_context/base.py)


def takes_tensors(kernel: Any) -> bool:
    """LMCache's own rule (transfer_context/base.py ``_detect_block_transfer_accepts_tensor``):
    a kernel whose ``lmcache_objects_ptrs`` is annotated with Tensor (the torch fallback)
    takes tensor lists; any other (the compiled binding, uninspectable) takes pointers."""
    try:
        param = inspect.signature(kernel).parameters.get("lmcache_objects_ptrs")
    except (TypeError, ValueError):
        return False
    return (param is not None and param.annotation is not inspect.Parameter.empty
            and "Tensor" in str(param.annotation))


def _signed(ptr: int) -> int:
    """A device pointer as int64 (LMCache views its uint64 array as int64)."""
    return ptr - (1 << 64) if ptr >= 1 << 63 else ptr


def call_block_kernel(kernel: Any, paged: Any, fmt: Any, layers: int, tensors: list[Any],
                      ids: list[int], device: torch.device, direction: Any, desc: Any,
                      chunk_tokens: int, blocks_per_chunk: int) -> None:
    """``multi_layer_block_kv_transfer`` called as LMCache's own callers call it
    (``gather_paged_kv_to_cpu`` / ``scatter_cpu_to_paged_kv``): tensor lists for the torch
    fallback; for the compiled binding an int64 tensor of the paged buffers' pointers on
    the device, the objects' pointers and a block-id tensor, at most 4 objects a call."""
    if takes_tensors(kernel):
        kernel(paged, tensors, ids, device, direction, desc, chunk_tokens, fmt, 0)
        return
    from lmcache.v1.gpu_connector.utils import get_group_data_ptrs

    ptrs = [_signed(p) for p in get_group_data_ptrs(paged, fmt, list(range(layers)))]
    paged_ptrs = torch.tensor(ptrs, dtype=torch.int64, device=device)
    block_ids = torch.tensor(ids, dtype=torch.int64, device=device)
    objects = [t.data_ptr() for t in tensors]
    for first in range(0, len(objects), MAX_OBJECTS_PER_CALL):
        batch = objects[first:first + MAX_OBJECTS_PER_CALL]
        blocks = block_ids[first * blocks_per_chunk:(first + len(batch)) * blocks_per_chunk]
        kernel(paged_ptrs, batch, blocks, device, direction, desc, chunk_tokens, fmt, 0)


def plain_trip(spec: LayoutSpec, path: str, device: torch.device, a: Replica, b: Replica,
                a_ids: list[int], b_ids: list[int]) -> list[str]:
    from lmcache.utils import EngineType
    from lmcache.v1.gpu_connector.utils import (
        get_block_size,
        get_num_blocks,
        get_num_layers,
        make_page_buffer_shape_desc,
        normalize_kv_and_discover_format,
        resolve_block_stride_and_log_layout,
    )
    from lmcache.v1.multiprocess.transfer_context.base import (
        compute_kv_layout,
        gather_paged_kv_to_cpu,
        scatter_cpu_to_paged_kv,
    )

    hints = {"kv_layout": spec.kv_layout}
    chunk_tokens = BLOCKS_PER_CHUNK * spec.block_size
    fmt, norm_a = normalize_kv_and_discover_format(list(a.kv_caches.values()), EngineType.VLLM,
                                                   layout_hints=hints)
    facts = [f"format {fmt.name}"]
    if path.startswith("kernel"):
        kernel = _kernel(path)
        fmt_b, norm_b = normalize_kv_and_discover_format(list(b.kv_caches.values()),
                                                         EngineType.VLLM, layout_hints=hints)
        layers = get_num_layers(norm_a, fmt)
        desc = make_page_buffer_shape_desc(
            norm_a, fmt, layer_idx=0, num_layers_in_group=layers,
            num_blocks=get_num_blocks(norm_a, fmt), block_size=get_block_size(norm_a, fmt),
            block_stride_elems=resolve_block_stride_and_log_layout(norm_a, fmt, 0, 0))
        _bs, _nl, hidden, _dt, _fmt, kv_size = compute_kv_layout(a.kv_caches, layout_hints=hints)
        shape = (layers, chunk_tokens, hidden) if kv_size == 1 else (2, layers, chunk_tokens,
                                                                      hidden)
        objects = _allocate(torch.Size(shape), torch_dtype(spec.dtype), NUM_CHUNKS, device)
        tensors = [o.tensor for o in objects]
        call_block_kernel(kernel, norm_a, fmt, layers, tensors, a_ids, device,
                          direction("D2H"), desc, chunk_tokens,
                          BLOCKS_PER_CHUNK)
        call_block_kernel(kernel, norm_b, fmt_b, get_num_layers(norm_b, fmt_b), tensors,
                          b_ids, device, direction("H2D"), desc,
                          chunk_tokens, BLOCKS_PER_CHUNK)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        _release(objects)
        facts.append(f"objects {tuple(shape)}")
    elif path == "engine-driven":
        chunks = gather_paged_kv_to_cpu(a.kv_caches, a_ids, BLOCKS_PER_CHUNK, layout_hints=hints)
        scatter_cpu_to_paged_kv(b.kv_caches, b_ids, chunks, BLOCKS_PER_CHUNK, 0,
                                layout_hints=hints)
        facts.append(f"host chunks {tuple(chunks[0].shape)}")
    else:
        facts.append(_server_trip(a.kv_caches, b.kv_caches, [a_ids], [b_ids], (), chunk_tokens,
                                  hints, path == "server-separate"))
    return facts


class _WrapperStandIn:
    """CPUCacheContext only calls ``.to_tensor()`` on the CpuShmTensorWrapper a worker sends;
    the real wrapper rebuilds the same (shape, stride, offset) view over shared memory."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def to_tensor(self) -> Any:
        return self.tensor


def _server_trip(kv_a: dict[str, Any], kv_b: dict[str, Any], ids_a: list[list[int]],
                 ids_b: list[list[int]], infos: Any, chunk_tokens: int, hints: dict[str, str],
                 separate: bool) -> str:
    """lmcache_driven_transfer's store and retrieve (minus IPC): object groups, staging."""
    from lmcache.utils import EngineType
    from lmcache.v1.multiprocess.group_view import expand_engine_block_ids

    from pytest_sharedkv.host.lmcache_api import resolve

    get_layout_desc = resolve("get_layout_desc")
    CPUCacheContext = resolve("CPUCacheContext")
    downsample_and_stage_block_ids = resolve("downsample_and_stage_block_ids")
    transfer_kv_per_object_group = resolve("transfer_kv_per_object_group")

    def context(kv: dict[str, Any]) -> Any:
        return CPUCacheContext([_WrapperStandIn(t) for t in kv.values()],
                               lmcache_tokens_per_chunk=chunk_tokens, layout_hints=hints,
                               engine_group_infos=infos, engine_type=EngineType.VLLM,
                               separate_object_groups=separate)

    ctx_a, ctx_b = context(kv_a), context(kv_b)
    manager = ctx_a.kv_layer_groups_manager
    staged_a = downsample_and_stage_block_ids(
        ctx_a, [list(x) for x in expand_engine_block_ids(infos, ids_a)])
    staged_b = downsample_and_stage_block_ids(
        ctx_b, [list(x) for x in expand_engine_block_ids(infos, ids_b)])
    stored = []
    for group in range(manager.num_object_groups):
        layout = get_layout_desc(ctx_a, chunk_tokens, group)
        objects = _allocate(list(layout.shapes), list(layout.dtypes), NUM_CHUNKS,
                            torch.device("cpu"))
        transfer_kv_per_object_group(ctx_a, staged_a, objects, object_group_id=group,
                                     batch_size=1, skip_first_n_tokens=0,
                                     direction=direction("D2H"),
                                     **known_keywords(transfer_kv_per_object_group,
                                                      transfer_key="store"))
        stored.append(objects)
    for group, objects in enumerate(stored):
        transfer_kv_per_object_group(ctx_b, staged_b, objects, object_group_id=group,
                                     batch_size=4, skip_first_n_tokens=0,
                                     direction=direction("H2D"),
                                     **known_keywords(transfer_kv_per_object_group,
                                                      transfer_key="retrieve"))
        _release(objects)
    kernel_groups = " ".join(
        f"kg{i}[{kg.engine_kv_format.name} bs={kg.shape_desc.bs} "
        f"{'recurrent' if kg.recurrent_state else 'attention'}]"
        for i, kg in enumerate(manager.kernel_groups))
    return f"{kernel_groups}; {manager.num_object_groups} object group(s)"


def plain_moves(spec: LayoutSpec, a_ids: list[int], b_ids: list[int]
                 ) -> dict[int, list[tuple[int, int]]]:
    pairs = list(zip(a_ids, b_ids, strict=True))
    if spec.generation == "legacy":  # K page i and V page NB + i
        nb = spec.num_blocks
        pairs = pairs + [(a + nb, b + nb) for a, b in pairs]
    return {layer: pairs for layer in range(spec.num_layers)}


def plain_round_trip(spec: LayoutSpec, path: str, device: torch.device) -> Trip:
    _quiet_lmcache()
    a = plain_replica(spec, SEED_A, device)
    b = plain_replica(spec, SEED_B, device)
    before = [p.raw.clone() for p in b.pools]
    a_ids, b_ids = block_ids(spec.num_blocks, NUM_CHUNKS * BLOCKS_PER_CHUNK, len(spec.name))
    facts = plain_trip(spec, path, device, a, b, a_ids, b_ids)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return Trip(check_round_trip(a.pools, b.pools, before, plain_moves(spec, a_ids, b_ids)),
                facts)


def hybrid_round_trip(spec: LayoutSpec, path: str, device: torch.device,
                      mutate: Any = None) -> Trip:
    """``mutate(a, b, ids_a, ids_b)`` replaces LMCache's transfer (the checker's self-tests)."""
    _quiet_lmcache()
    with kv_cache_interface() as (iface, registry, interface):
        config = hybrid_config(spec, iface, registry)
        groups = config.kv_cache_groups
        per_group = NUM_CHUNKS * BLOCKS_PER_CHUNK
        if per_group * len(groups) > spec.num_blocks:
            raise ValueError(f"layout {spec.name}: needs {per_group * len(groups)} blocks")
        rng = random.Random(len(spec.name))
        free_a = rng.sample(range(spec.num_blocks), spec.num_blocks)
        free_b = rng.sample(range(spec.num_blocks), spec.num_blocks)
        ids_a = [free_a[g * per_group:(g + 1) * per_group] for g in range(len(groups))]
        ids_b = [free_b[g * per_group:(g + 1) * per_group] for g in range(len(groups))]
        owner_a = {blk: g for g, ids in enumerate(ids_a) for blk in ids}
        owner_b = {blk: g for g, ids in enumerate(ids_b) for blk in ids}
        a = hybrid_replica(spec, config, iface, SEED_A, device, owner_a)
        b = hybrid_replica(spec, config, iface, SEED_B, device, owner_b)
        before = [p.raw.clone() for p in b.pools]
        facts = [f"vllm.v1.kv_cache_interface: {interface}", spec.describe()]
        if mutate is not None:
            mutate(a, b, ids_a, ids_b)
        elif path.startswith("server"):
            from lmcache.integration.vllm.kv_cache_group_edits import apply_kv_cache_group_edits
            from lmcache.integration.vllm.kv_cache_groups import (
                create_engine_group_infos_from_vllm,
            )

            hints = {"kv_layout": spec.kv_layout}
            kv_a = apply_kv_cache_group_edits(config, a.kv_caches, layout_hints=hints)
            kv_b = apply_kv_cache_group_edits(config, b.kv_caches, layout_hints=hints)
            infos = create_engine_group_infos_from_vllm(config, kv_a, layout_hints=hints)
            facts.append(_server_trip(kv_a, kv_b, ids_a, ids_b, infos,
                                      BLOCKS_PER_CHUNK * spec.logical_block_size(), hints,
                                      path == "server-separate"))
        else:
            _unsupported_hybrid_path(spec, path, a, b, ids_a, ids_b)
        moves = hybrid_moves(config, iface, ids_a, ids_b, path == "server-separate")
    return Trip(check_round_trip(a.pools, b.pools, before, moves), facts)


def _unsupported_hybrid_path(spec: LayoutSpec, path: str, a: Replica, b: Replica,
                             ids_a: list[list[int]], ids_b: list[list[int]]) -> None:
    """Ask LMCache to move a hybrid replica on a single-group path; it should refuse."""
    from lmcache.v1.multiprocess.transfer_context.base import (
        gather_paged_kv_to_cpu,
        scatter_cpu_to_paged_kv,
    )

    hints = {"kv_layout": spec.kv_layout}
    flat_a = [blk for ids in ids_a for blk in ids]
    flat_b = [blk for ids in ids_b for blk in ids]
    try:
        if path == "engine-driven":
            chunks = gather_paged_kv_to_cpu(a.kv_caches, flat_a, BLOCKS_PER_CHUNK,
                                            layout_hints=hints)
            scatter_cpu_to_paged_kv(b.kv_caches, flat_b, chunks, BLOCKS_PER_CHUNK, 0,
                                    layout_hints=hints)
        else:
            from lmcache.utils import EngineType
            from lmcache.v1.gpu_connector.utils import normalize_kv_and_discover_format

            _kernel(path)
            normalize_kv_and_discover_format(list(a.kv_caches.values()), EngineType.VLLM,
                                             layout_hints=hints)
    except Unsupported:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise Unsupported(f"{type(exc).__name__}: {first}"[:300]) from exc


def hybrid_moves(config: Any, iface: Any, ids_a: list[list[int]], ids_b: list[list[int]],
                 separate: bool) -> dict[int, list[tuple[int, int]]]:
    """Attention groups move every block; recurrent (GDN) groups keep a one-block window,
    so only the last block of each chunk moves; with separate object groups the recurrent
    group's retrieve also restores only the last chunk (kv_cache_groups.py,
    object_group_transfer.py)."""
    pool_of = {n: i for i, t in enumerate(config.kv_cache_tensors) for n in t.shared_by}
    moves: dict[int, list[tuple[int, int]]] = {}
    for g, group in enumerate(config.kv_cache_groups):
        pairs = list(zip(ids_a[g], ids_b[g], strict=True))
        if not isinstance(group.kv_cache_spec, iface.AttentionSpec):
            pairs = [p for k, p in enumerate(pairs) if k % BLOCKS_PER_CHUNK == BLOCKS_PER_CHUNK - 1]
            if separate:
                pairs = pairs[-1:]
        for name in group.layer_names:
            moves.setdefault(pool_of[name], []).extend(pairs)
    return moves


def round_trip(spec: LayoutSpec, path: str, device: torch.device) -> Trip:
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, not {path!r}")
    if spec.family == "hybrid":
        return hybrid_round_trip(spec, path, device)
    return plain_round_trip(spec, path, device)

