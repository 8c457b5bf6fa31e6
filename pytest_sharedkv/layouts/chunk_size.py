"""LMCache's chunk in tokens for a model: whole engine blocks, derived from ``config.json``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_sharedkv.layouts.specs import LayoutSpec


def derive_chunk_size(model: Path, blocks: int = 2) -> int:
    """LMCache's chunk must be whole engine blocks: for a hybrid model vLLM raises the
    attention block so one page holds the Gated DeltaNet state (the packed_page tier's
    arithmetic, LayoutSpec.logical_block_size); 2 blocks per chunk, as measured."""
    return chunk_size_for_config(json.loads((model / "config.json").read_text()), blocks)


def chunk_size_for_config(config: Mapping[str, Any], blocks: int = 2) -> int:
    """derive_chunk_size from a config.json already read (or not yet written)."""
    types = config.get("layer_types") or []
    if "linear_attention" not in types:
        return 16 * 16
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
    return spec.logical_block_size() * blocks
