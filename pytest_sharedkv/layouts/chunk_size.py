"""LMCache's chunk in tokens for a model: ``blocks`` whole engine blocks (two by default,
as ``--sharedkv-chunk-size``'s help says), the engine block derived from ``config.json``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_sharedkv.layouts.specs import LayoutSpec
from pytest_sharedkv.models.config_file import read_config

# vLLM's default block size for attention-only models (CacheConfig.block_size); not
# checked against vLLM 0.26's source here
ATTENTION_BLOCK = 16
BLOCKS_PER_CHUNK = 2  # as measured on the hybrid models


def engine_block_size(config: Mapping[str, Any]) -> int:
    """The block vLLM gives this model: for a hybrid model it raises the attention block
    so one page holds the Gated DeltaNet state (the packed_page tier's arithmetic,
    LayoutSpec.logical_block_size); an attention-only model keeps the default."""
    types = config.get("layer_types") or []
    if "linear_attention" not in types:
        return ATTENTION_BLOCK
    ssm = str(config.get("mamba_ssm_dtype") or "bfloat16").replace("torch.", "")
    spec = LayoutSpec(
        "engine", "hybrid", "from the model's config.json", backend="FLASH_ATTN",
        num_kv_heads=int(config["num_key_value_heads"]), head_dim=int(config["head_dim"]),
        lin_k_heads=int(config["linear_num_key_heads"]),
        lin_v_heads=int(config["linear_num_value_heads"]),
        lin_k_dim=int(config["linear_key_head_dim"]),
        lin_v_dim=int(config["linear_value_head_dim"]),
        conv_kernel=int(config["linear_conv_kernel_dim"]),
        ssm_dtype=ssm if ssm in ("bfloat16", "float16", "float32") else "bfloat16")
    return spec.logical_block_size()


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token_at_least(config: Mapping[str, Any]) -> int:
    """At least the bytes a token takes in LMCache's pool for this config.json: every
    attention layer's K and V at the model's dtype (one byte where it names none: fp8);
    a hybrid model's recurrent state is left out, so a chunk takes this or more."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(cfg, Mapping)
    types = cfg.get("layer_types")
    layers = (sum(t != "linear_attention" for t in types) if isinstance(types, list) and types
              else int(cfg.get("num_hidden_layers") or 0))
    heads = int(cfg.get("num_attention_heads") or 0)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or (int(cfg.get("hidden_size") or 0) // heads
                                           if heads else 0))
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "").replace("torch.", "")
    return layers * kv_heads * head_dim * 2 * DTYPE_BYTES.get(dtype, 1)


def chunk_size_for_config(config: Mapping[str, Any], blocks: int = BLOCKS_PER_CHUNK) -> int:
    """BLOCKS engine blocks of the model this config.json describes (an empty config: a
    model not known here, so the attention-only default)."""
    return engine_block_size(config) * blocks


def derive_chunk_size(model: Path | None, blocks: int = BLOCKS_PER_CHUNK) -> int:
    """chunk_size_for_config from MODEL's config.json (None: no model known)."""
    return chunk_size_for_config(read_config(model) if model is not None else {}, blocks)


DEFAULT_CHUNK = chunk_size_for_config({})  # where no model is known: two default blocks
