"""A hybrid model's registration in the LMCache server, built on CPU by LMCache's own code, for
the fault self-tests: vLLM's KV cache config and tensors (layouts.build, with the packed_page
tier's stand-in for vllm.v1.kv_cache_interface), LMCache's registration edits and engine
group infos (as ``LMCacheMPConnector.register_kv_caches``), its ``KVLayerGroupsManager``
(as ``CPUCacheContext`` builds it), and the object layout the GPU server's context gives
(``_TempGPUBuffer`` on the meta device: LMCache's code, no GPU, no bytes).

``Pair`` holds two replicas (A stores, B retrieves) with CPU cache contexts, so a transfer
runs through LMCache's real ``transfer_kv_per_object_group`` on CPU (its torch fallback).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

import torch

from pytest_sharedkv.layouts.build import (
    FUSED_ORDER,
    Replica,
    attention_view,
    hybrid_config,
    hybrid_replica,
    mamba_views,
)
from pytest_sharedkv.layouts.object_layout import ObjectLayout, read_layout
from pytest_sharedkv.layouts.specs import LayoutSpec
from pytest_sharedkv.packed_page.vllm_interface import kv_cache_interface

HINTS = {"kv_layout": "NHD"}


def quiet() -> None:
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.WARNING)


def spec_for(config: Mapping[str, Any], num_blocks: int) -> LayoutSpec:
    """The hybrid layout vLLM gives CONFIG's model (FlashAttention, NHD, align mode)."""
    ssm = str(config.get("mamba_ssm_dtype") or "bfloat16")
    return LayoutSpec(
        "fault-test", "hybrid", "", num_layers=int(config["num_hidden_layers"]),
        full_attention_interval=int(config["full_attention_interval"]),
        num_kv_heads=int(config["num_key_value_heads"]), head_dim=int(config["head_dim"]),
        lin_k_heads=int(config["linear_num_key_heads"]),
        lin_v_heads=int(config["linear_num_value_heads"]),
        lin_k_dim=int(config["linear_key_head_dim"]),
        lin_v_dim=int(config["linear_value_head_dim"]),
        conv_kernel=int(config["linear_conv_kernel_dim"]), ssm_dtype=ssm,
        num_blocks=num_blocks)


def _unfilled_views(spec: LayoutSpec, config: Any, iface: Any) -> dict[str, Any]:
    """vLLM's registered tensors over unfilled pools (torch.empty: the 27B's are large)."""
    raws: dict[str, torch.Tensor] = {}
    for tensor in config.kv_cache_tensors:
        raw = torch.empty(tensor.size, dtype=torch.int8)
        raws.update({name: raw for name in tensor.shared_by})
    kv: dict[str, Any] = {}
    for group in config.kv_cache_groups:
        s = group.kv_cache_spec
        for name in group.layer_names:
            nb = raws[name].numel() // s.page_size_bytes
            if isinstance(s, iface.AttentionSpec):
                kv[name] = attention_view(raws[name], s.dtype,
                                          (nb, s.num_kv_heads, s.block_size, 2 * s.head_size),
                                          FUSED_ORDER["NHD"])
            else:
                kv[name] = mamba_views(raws[name], nb, s.shapes, s.dtypes, s.page_size_bytes)
    return dict(sorted(kv.items(), key=lambda item: int(item[0].split(".")[2])))


def register(config: Any, kv: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """LMCache's registration edits and engine group infos (the stand-in must be active)."""
    from lmcache.integration.vllm.kv_cache_group_edits import apply_kv_cache_group_edits
    from lmcache.integration.vllm.kv_cache_groups import create_engine_group_infos_from_vllm

    edited = apply_kv_cache_group_edits(config, kv, layout_hints=HINTS)
    return edited, create_engine_group_infos_from_vllm(config, edited, layout_hints=HINTS)


def groups_manager(edited: dict[str, Any], infos: Any, chunk: int) -> Any:
    """LMCache's KVLayerGroupsManager, as CPUCacheContext builds it."""
    from lmcache.utils import EngineType
    from lmcache.v1.gpu_connector.utils import normalize_and_discover_per_layer_formats
    from lmcache.v1.kv_layer_groups import KVLayerGroupsManager
    from lmcache.v1.multiprocess.group_view import engine_group_layer_indices

    kv, formats = normalize_and_discover_per_layer_formats(
        list(edited.values()), engine_group_layer_indices(infos), EngineType.VLLM, HINTS)
    return KVLayerGroupsManager(list(kv), engine_kv_formats=formats, engine_group_infos=infos,
                                lmcache_tokens_per_chunk=chunk)


class ServerContext:
    """What the GPU server's cache context answers about its objects, by LMCache's code:
    its temp buffer's shapes (cuda/cache_context.py ``_TempGPUBuffer``) on the meta device,
    and the base context's offset and block arithmetic."""

    def __init__(self, manager: Any, chunk: int) -> None:
        from lmcache.v1.platform.devices.cuda.cache_context import _TempGPUBuffer

        self.kv_layer_groups_manager = manager
        self.lmcache_tokens_per_chunk = chunk
        self._buffer = _TempGPUBuffer(manager, chunk, torch.device("meta"))

    def get_kernel_group_shape_dtype(self, num_tokens: int, kernel_group: int) -> Any:
        return self._buffer.get_kernel_group_shape_dtype(num_tokens, kernel_group)

    def get_kernel_group_offset_in_object(self, object_group: int, kernel_group: int) -> int:
        from lmcache.v1.platform.base.cache_context import BaseCacheContext

        return int(BaseCacheContext.get_kernel_group_offset_in_object(
            self, object_group, kernel_group))

    def calculate_num_blocks(self, num_tokens: int, kernel_group: int) -> int:
        return int(self.kv_layer_groups_manager.calculate_num_blocks(kernel_group, num_tokens))


def server_layout(config: Mapping[str, Any], chunk_blocks: int) -> ObjectLayout:
    """The object layout the LMCache server (GPU context) uses for CONFIG's model with
    chunks of CHUNK_BLOCKS engine blocks."""
    quiet()
    spec = spec_for(config, num_blocks=2)
    with kv_cache_interface() as (iface, registry, _):
        vllm_config = hybrid_config(spec, iface, registry)
        kv = _unfilled_views(spec, vllm_config, iface)
        edited, infos = register(vllm_config, kv)
    chunk = chunk_blocks * spec.logical_block_size()
    return read_layout(ServerContext(groups_manager(edited, infos, chunk), chunk), 0,
                       names=list(edited))


# -- two replicas through LMCache's real transfer ------------------------------------------


class _WrapperStandIn:
    """CPUCacheContext only calls ``.to_tensor()`` on what a worker sends."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def to_tensor(self) -> Any:
        return self.tensor


@dataclass
class Pair:
    """Replica A (stores) and B (retrieves) of a hybrid model, one block a chunk, with CPU
    cache contexts over their pools."""

    spec: LayoutSpec
    config: Any
    a: Replica
    b: Replica
    ctx_a: Any
    ctx_b: Any
    layer_names: list[str]
    groups: list[list[str]]  # kernel group -> layer names (LMCache's order)
    recurrent: list[bool]
    free_a: list[int] = field(default_factory=list)
    free_b: list[int] = field(default_factory=list)

    @property
    def chunk(self) -> int:
        return int(self.ctx_a.lmcache_tokens_per_chunk)

    def page(self, replica: Replica, layer: str, block: int) -> bytes:
        """One layer's page of one engine block, as raw bytes."""
        pool = next(p for p, t in zip(replica.pools, self.config.kv_cache_tensors, strict=True)
                    if layer in t.shared_by)
        page = pool.page_bytes
        return bytes(pool.raw[block * page:(block + 1) * page].view(torch.uint8).tolist())

    def take(self, replica: str, chunks: int) -> list[list[int]]:
        """Engine block ids per kernel group for an op of CHUNKS chunks (one block each),
        align mode: a recurrent group's blocks are the null block but the last."""
        free = self.free_a if replica == "a" else self.free_b
        ids = []
        for recurrent in self.recurrent:
            if recurrent:
                ids.append([0] * (chunks - 1) + [free.pop()])
            else:
                ids.append([free.pop() for _ in range(chunks)])
        return ids

    def objects(self, count: int, fill: int = 0xEE) -> list[Any]:
        """Memory objects for COUNT chunks of object group 0 (LMCache's own allocator),
        holding FILL until written."""
        from lmcache.v1.memory_allocators.tensor_memory_allocator import (
            TensorMemoryAllocator,
        )

        from pytest_sharedkv.host.lmcache_api import resolve

        layout = resolve("get_layout_desc")(self.ctx_a, self.chunk, 0)
        size = sum(prod(s) * d.itemsize for s, d in zip(layout.shapes, layout.dtypes,
                                                        strict=True))
        buffer = torch.full((count * (size + 4096),), fill, dtype=torch.uint8)
        allocator = TensorMemoryAllocator(buffer)
        return [allocator.allocate(list(layout.shapes), list(layout.dtypes))
                for _ in range(count)]

    @staticmethod
    def release(objs: list[Any]) -> None:
        """Hand the objects back as LMCache's callers do (no collection warnings)."""
        for obj in objs:
            obj.ref_count_down()

    def transfer(self, function: Any, replica: str, ids: Sequence[Sequence[int]],
                 objs: list[Any], direction: str, request: str) -> None:
        """One op, called as the server calls it (lmcache_driven_transfer.py store and
        retrieve, 0.5.6): staged ids, batch 1 to store and 4 to retrieve, the op's key."""
        from pytest_sharedkv.host.lmcache_api import direction as lmcache_direction
        from pytest_sharedkv.host.lmcache_api import resolve

        context = self.ctx_a if replica == "a" else self.ctx_b
        host = [list(g) for g in ids]
        staged = resolve("downsample_and_stage_block_ids")(context, host)
        function(context, staged, objs, object_group_id=0,
                 batch_size=1 if direction == "D2H" else 4, skip_first_n_tokens=0,
                 direction=lmcache_direction(direction), transfer_key=f"{request}#1",
                 block_ids_host=host)


def copy_model_pair(num_blocks: int = 24) -> Pair:
    """The copy model's geometry (models/copy_model.py), chunks of one engine block."""
    from lmcache.utils import EngineType

    from pytest_sharedkv.host.lmcache_api import resolve
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict

    quiet()
    spec = spec_for(config_dict(CopyModelRecipe()), num_blocks)
    with kv_cache_interface() as (iface, registry, _):
        vllm_config = hybrid_config(spec, iface, registry)
        owner = {b: 0 for b in range(num_blocks)}
        a = hybrid_replica(spec, vllm_config, iface, 11, torch.device("cpu"), owner)
        b = hybrid_replica(spec, vllm_config, iface, 22, torch.device("cpu"), owner)
        kv_a, infos = register(vllm_config, a.kv_caches)
        kv_b, _ = register(vllm_config, b.kv_caches)
    chunk = spec.logical_block_size()
    context = resolve("CPUCacheContext")

    def cpu(kv: dict[str, Any]) -> Any:
        return context([_WrapperStandIn(t) for t in kv.values()],
                       lmcache_tokens_per_chunk=chunk, layout_hints=HINTS,
                       engine_group_infos=infos, engine_type=EngineType.VLLM)

    ctx_a, ctx_b = cpu(kv_a), cpu(kv_b)
    quiet()
    names = list(kv_a)
    kernel_groups = ctx_a.kv_layer_groups_manager.kernel_groups
    return Pair(spec, vllm_config, a, b, ctx_a, ctx_b, names,
                [[names[i] for i in g.layer_indices] for g in kernel_groups],
                [bool(g.recurrent_state) for g in kernel_groups],
                free_a=list(range(num_blocks - 1, 0, -1)),
                free_b=list(range(1, num_blocks)))
