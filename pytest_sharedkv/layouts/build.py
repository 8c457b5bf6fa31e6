"""Replicas: raw KV pools and the exact tensors vLLM registers over them, position-filled.

The views replicate vLLM 0.26.0's worker code: one raw int8 pool per ``KVCacheTensor``,
``raw.view(dtype).view(physical).permute(inverse stride order)`` for attention
(vllm/v1/worker/gpu/attn_utils.py:_reshape_attention_kv_cache), and for Gated DeltaNet
layers one strided view per state, packed at the start of a padded page
(``[conv | ssm | padding]``, the MambaSpec branch of _reshape_kv_cache). Hybrid configs
group layers like vllm/v1/core/kv_cache_utils.py (_get_kv_cache_groups_uniform_page_size,
get_kv_cache_config_from_groups): one pool shared by one layer of every group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from types import ModuleType
from typing import Any

import torch

from pytest_sharedkv.layouts.fill import PageMap, Region, fill_position_coded
from pytest_sharedkv.layouts.specs import LayoutSpec

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                "fp8": torch.uint8, "uint8": torch.uint8}
# vLLM 0.26 FlashAttention / FlashInfer: shape (NB, H, BS, 2*D); stride order per layout.
FUSED_ORDER = {"NHD": (0, 2, 1, 3), "HND": (0, 1, 2, 3)}
# vLLM 0.25: (NB, 2, BS, H, D); legacy: (2, NB, BS, H, D).
RANK5_ORDER = {"NHD": (0, 1, 2, 3, 4), "HND": (0, 1, 3, 2, 4)}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def attention_view(raw: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...],
                   stride_order: tuple[int, ...]) -> torch.Tensor:
    """vLLM's _reshape_attention_kv_cache (unpadded, unpacked branch)."""
    physical = tuple(shape[i] for i in stride_order)
    inverse = [stride_order.index(i) for i in range(len(stride_order))]
    return raw.view(dtype).view(physical).permute(*inverse)


def mamba_views(raw: torch.Tensor, num_blocks: int, shapes: tuple[tuple[int, ...], ...],
                dtypes: tuple[torch.dtype, ...], page_bytes: int) -> list[torch.Tensor]:
    """vLLM's MambaSpec branch: each state's dim-0 stride is one whole padded page."""
    views, offset = [], 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        itemsize = torch.empty((), dtype=dtype).element_size()
        contiguous = torch.empty((num_blocks, *shape), device="meta").stride()
        views.append(torch.as_strided(raw.view(dtype), (num_blocks, *shape),
                                      (page_bytes // itemsize, *contiguous[1:]),
                                      storage_offset=offset // itemsize))
        offset += prod(shape) * itemsize
    return views


@dataclass
class Pool:
    """One raw pool, its page size, and which layer owns each block's bytes."""

    raw: torch.Tensor
    page_bytes: int
    # block id -> (kernel group, layer name); plain layouts: every block -> (0, layer)
    owners: dict[int, tuple[int, str]] = field(default_factory=dict)
    default_owner: tuple[int, str] = (0, "")
    maps: dict[int, PageMap] = field(default_factory=dict)  # kernel group -> page geometry
    plane_blocks: int = 0  # legacy (2, NB, ...): V plane pages follow NB K plane pages

    def owner(self, block: int) -> tuple[int, str]:
        return self.owners.get(block, self.default_owner)


@dataclass
class Replica:
    pools: list[Pool]
    kv_caches: dict[str, Any]  # layer name -> tensor, or [conv, ssm] for GDN layers
    config: Any = None  # hybrid: the KVCacheConfig
    interface: str = ""


def _attention_map(spec: LayoutSpec) -> PageMap:
    kernel = spec.kernel_block_size()
    pages = spec.logical_block_size() // kernel
    es = spec.itemsize
    if spec.family == "mla":
        return PageMap([Region("latent", 0, (("token", spec.block_size),
                                             ("byte", spec.mla_head_size * es)))])
    inner: tuple[tuple[str, int], ...]
    if spec.generation == "vllm025":
        inner = (("kv", 2), ("token", spec.block_size), ("head", spec.num_kv_heads),
                 ("byte", spec.head_dim * es))
        if spec.kv_layout == "HND":
            inner = (("kv", 2), ("head", spec.num_kv_heads), ("token", spec.block_size),
                     ("byte", spec.head_dim * es))
        return PageMap([Region("kv", 0, inner)])
    if spec.generation == "legacy":
        inner = (("token", spec.block_size), ("head", spec.num_kv_heads),
                 ("byte", spec.head_dim * es))
        if spec.kv_layout == "HND":
            inner = (("head", spec.num_kv_heads), ("token", spec.block_size),
                     ("byte", spec.head_dim * es))
        return PageMap([Region("k-or-v plane", 0, inner)])
    token_major = (("kernel_page", pages), ("token", kernel), ("head", spec.num_kv_heads),
                   ("byte", 2 * spec.head_dim * es))
    head_major = (("kernel_page", pages), ("head", spec.num_kv_heads), ("token", kernel),
                  ("byte", 2 * spec.head_dim * es))
    return PageMap([Region("k|v", 0, token_major if spec.kv_layout == "NHD" else head_major)])


def plain_replica(spec: LayoutSpec, seed: int, device: torch.device) -> Replica:
    dtype = torch_dtype(spec.dtype)
    nb, bs, h, d = spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim
    page = spec.page_bytes()
    pools, kv = [], {}
    for layer in range(spec.num_layers):
        name = f"model.layers.{layer}.self_attn.attn"
        planes = 2 if spec.generation == "legacy" else 1
        page_bytes = page // planes
        raw = torch.empty(nb * page, dtype=torch.int8, device=device)
        fill_position_coded(raw, seed, layer)
        if spec.family == "mla":
            view = attention_view(raw, dtype, (nb, bs, spec.mla_head_size), (0, 1, 2))
        elif spec.generation == "vllm026":
            view = attention_view(raw, dtype, (nb, h, bs, 2 * d), FUSED_ORDER[spec.kv_layout])
        elif spec.generation == "vllm025":
            view = attention_view(raw, dtype, (nb, 2, bs, h, d), RANK5_ORDER[spec.kv_layout])
        else:
            view = attention_view(raw, dtype, (2, nb, bs, h, d), RANK5_ORDER[spec.kv_layout])
        kv[name] = view
        pools.append(Pool(raw=raw, page_bytes=page_bytes, default_owner=(0, name),
                          maps={0: _attention_map(spec)},
                          plane_blocks=nb if planes == 2 else 0))
    return Replica(pools=pools, kv_caches=kv)


def layer_names(spec: LayoutSpec) -> tuple[list[str], list[str]]:
    attention, gdn = [], []
    for i in range(spec.num_layers):
        if (i + 1) % spec.full_attention_interval == 0:
            attention.append(f"model.layers.{i}.self_attn.attn")
        else:
            gdn.append(f"model.layers.{i}.linear_attn")
    return attention, gdn


def hybrid_config(spec: LayoutSpec, iface: ModuleType, registry: ModuleType) -> Any:
    """The KVCacheConfig vLLM builds for this hybrid model (uniform page size, align mode)."""
    logical, page = spec.logical_block_size(), spec.page_bytes()
    attn_spec = iface.FullAttentionSpec(block_size=logical, num_kv_heads=spec.num_kv_heads,
                                        head_size=spec.head_dim, dtype=torch_dtype(spec.dtype))
    conv, ssm = spec.gdn_state_shapes()
    mamba_spec = iface.MambaSpec(block_size=logical, shapes=(conv, ssm),
                                 dtypes=(torch_dtype(spec.dtype), torch_dtype(spec.ssm_dtype)),
                                 page_size_padded=page,
                                 mamba_type=registry.MambaAttentionBackendEnum.GDN_ATTN,
                                 mamba_cache_mode="align")
    if attn_spec.page_size_bytes != mamba_spec.page_size_bytes:
        raise ValueError(f"layout {spec.name}: page sizes did not unify")
    attention, gdn = layer_names(spec)
    by_spec = {attn_spec: attention, mamba_spec: gdn}
    smallest = min(len(v) for v in by_spec.values())
    largest = max(len(v) for v in by_spec.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for kv_spec, layers in sorted(by_spec.items(), key=lambda kv: _first_layer(kv[1])):
        n_groups = -(-len(layers) // group_size)
        for i in range(n_groups):
            groups.append(iface.KVCacheGroupSpec(layers[i::n_groups], kv_spec))
    groups.sort(key=lambda g: _first_layer(g.layer_names))
    tensors = [
        iface.KVCacheTensor(size=page * spec.num_blocks,
                            shared_by=[g.layer_names[i] for g in groups if i < len(g.layer_names)])
        for i in range(group_size)
    ]
    return iface.KVCacheConfig(num_blocks=spec.num_blocks, kv_cache_tensors=tensors,
                               kv_cache_groups=groups)


def _first_layer(names: list[str]) -> int:
    return min(int(n.split(".")[2]) for n in names)


def _mamba_map(spec: LayoutSpec) -> PageMap:
    conv, ssm = spec.gdn_state_shapes()
    conv_bytes = prod(conv) * spec.itemsize
    ssm_bytes = prod(ssm) * torch_dtype(spec.ssm_dtype).itemsize
    return PageMap([
        Region("conv_state", 0, (("row", conv[0]), ("byte", conv[1] * spec.itemsize))),
        Region("ssm_state", conv_bytes, (("v_head", ssm[0]), ("byte", ssm[1] * ssm[2] *
                                                               torch_dtype(spec.ssm_dtype).itemsize))),
        Region("padding", conv_bytes + ssm_bytes,
               (("byte", spec.page_bytes() - conv_bytes - ssm_bytes),)),
    ])


def hybrid_replica(spec: LayoutSpec, config: Any, iface: ModuleType, seed: int,
                   device: torch.device, block_owner: dict[int, int]) -> Replica:
    """Raw pools shared by one layer of every group; ``block_owner``: block id -> group."""
    page, kernel = spec.page_bytes(), spec.kernel_block_size()
    group_of = {n: gi for gi, g in enumerate(config.kv_cache_groups) for n in g.layer_names}
    pools, owner_raw = [], {}
    for index, tensor in enumerate(config.kv_cache_tensors):
        raw = torch.zeros(tensor.size, dtype=torch.int8, device=device)
        fill_position_coded(raw, seed, index)
        layer_of_group = {group_of[n]: n for n in tensor.shared_by}
        maps = {group_of[n]: (_attention_map(spec) if "self_attn" in n else _mamba_map(spec))
                for n in tensor.shared_by}
        pools.append(Pool(raw=raw, page_bytes=page, maps=maps, default_owner=(-1, "free"),
                          owners={b: (g, layer_of_group[g]) for b, g in block_owner.items()
                                  if g in layer_of_group}))
        for name in tensor.shared_by:
            owner_raw[name] = raw
    kv: dict[str, Any] = {}
    for group in config.kv_cache_groups:
        kv_spec = group.kv_cache_spec
        for name in group.layer_names:
            raw = owner_raw[name]
            nb = raw.numel() // kv_spec.page_size_bytes
            if isinstance(kv_spec, iface.AttentionSpec):
                kernel_nb = nb * (kv_spec.block_size // kernel)
                kv[name] = attention_view(raw, kv_spec.dtype,
                                          (kernel_nb, kv_spec.num_kv_heads, kernel,
                                           2 * kv_spec.head_size),
                                          FUSED_ORDER[spec.kv_layout])
            else:
                kv[name] = mamba_views(raw, nb, kv_spec.shapes, kv_spec.dtypes,
                                       kv_spec.page_size_bytes)
    ordered = dict(sorted(kv.items(), key=lambda item: int(item[0].split(".")[2])))
    return Replica(pools=pools, kv_caches=ordered, config=config)
