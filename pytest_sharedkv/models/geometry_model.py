"""A random-weight model with the KV geometry of the field study's 27B hybrid model.

Why: the perf tier times cross-replica transfers, and their cost is set by the bytes a
prompt's KV and recurrent state take, not by the weights. This model has exactly the
27B's cache geometry (``perf.geometry_27b.QWEN35_27B_GEOMETRY``: 64 layers, 3 Gated
DeltaNet to 1 full attention, 4 KV heads of 256 in 16 attention layers, so 65,536 bytes a
token; 16 key and 48 value linear heads of 128, conv kernel 4; 24 query heads; 256k
context), so bytes per token and transfer sizes are real, while the residual width,
the MoE and the vocabulary are tiny, so its weights are about 0.7 GB in bf16 instead of
54 GB. The attention and recurrent cores (query heads x head_dim, linear heads x dims)
keep the real model's sizes; its projections and experts are far cheaper, so its prefill
is cheaper than the real model's.

Qwen3-Next family (``Qwen3NextForCausalLM``, as the copy model: vLLM 0.26 serves it; its
MoE layers are required there and kept tiny), the copy model's word-level tokenizer and
vocabulary (prompts in its words have known token counts), weights drawn from a seeded
``torch.Generator`` on CPU (seconds; nothing is downloaded). The digest covers the config,
the weights and the canonical tokenizer spec, as the copy model's does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECIPE_VERSION = 1
KIND = "geometry"
# the fields of the 27B's config.json that decide its KV and recurrent-state bytes
GEOMETRY_FIELDS = (
    "num_hidden_layers", "layer_types", "full_attention_interval", "num_attention_heads",
    "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
    "mamba_ssm_dtype", "partial_rotary_factor", "max_position_embeddings",
)


@dataclass(frozen=True)
class GeometryModelRecipe:
    """Everything the model is made from besides the 27B's geometry; the digest changes
    with any field. ``layers`` (a multiple of the 4-layer pattern) shrinks the stack for
    quick self-tests only: the perf tier serves the full 64."""

    seed: int = 0
    hidden_size: int = 256
    experts: int = 4  # vLLM's Qwen3-Next needs MoE layers; tiny ones
    expert_size: int = 64
    init_std: float = 0.02
    layers: int | None = None  # None: all of the 27B's layers
    rope_theta: float = 1e7

    def key(self) -> str:
        text = json.dumps({"kind": KIND, "v": RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _geometry() -> dict[str, Any]:
    from pytest_sharedkv.models.geometry_27b import QWEN35_27B_GEOMETRY

    return {k: QWEN35_27B_GEOMETRY[k] for k in GEOMETRY_FIELDS if k in QWEN35_27B_GEOMETRY}


def config_dict(recipe: GeometryModelRecipe) -> dict[str, Any]:
    """config.json: the 27B's geometry, the recipe's small sizes, the copy vocabulary."""
    from pytest_sharedkv.models.copy_model import CopyModelRecipe

    geometry = _geometry()
    if recipe.layers is not None:
        interval = int(geometry["full_attention_interval"])
        if recipe.layers < interval or recipe.layers % interval:
            raise ValueError(f"layers must be a multiple of {interval}, not {recipe.layers}")
        geometry["num_hidden_layers"] = recipe.layers
        geometry["layer_types"] = list(geometry["layer_types"][:recipe.layers])
    rope = {"rope_type": "default", "rope_theta": recipe.rope_theta,
            "partial_rotary_factor": geometry["partial_rotary_factor"]}
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        **geometry,
        "vocab_size": CopyModelRecipe().vocab_size, "hidden_size": recipe.hidden_size,
        "intermediate_size": recipe.expert_size,
        "num_experts": recipe.experts, "num_experts_per_tok": 2,
        "moe_intermediate_size": recipe.expert_size,
        "shared_expert_intermediate_size": recipe.expert_size, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "attention_bias": False, "attention_dropout": 0.0,
        "rope_parameters": rope, "rope_theta": recipe.rope_theta,
        "tie_word_embeddings": False, "use_cache": True,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "dtype": "bfloat16", "torch_dtype": "bfloat16",
        "sharedkv": {"kind": KIND, "recipe_version": RECIPE_VERSION, **asdict(recipe)},
    }


def shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, in the Hugging Face Qwen3-Next naming vLLM loads."""
    h = int(config["hidden_size"])
    heads, kv_heads, hd = (int(config[k]) for k in ("num_attention_heads",
                                                    "num_key_value_heads", "head_dim"))
    nk, nv, dk, dv = (int(config[k]) for k in ("linear_num_key_heads",
                                               "linear_num_value_heads",
                                               "linear_key_head_dim", "linear_value_head_dim"))
    kernel = int(config["linear_conv_kernel_dim"])
    experts, size = int(config["num_experts"]), int(config["moe_intermediate_size"])
    shared = int(config["shared_expert_intermediate_size"])
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (int(config["vocab_size"]), h),
        "model.norm.weight": (h,), "lm_head.weight": (int(config["vocab_size"]), h)}
    for layer, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{layer}."
        if kind == "linear_attention":
            a = p + "linear_attn."
            out[a + "in_proj_qkvz.weight"] = (2 * nk * dk + 2 * nv * dv, h)
            out[a + "in_proj_ba.weight"] = (2 * nv, h)
            out[a + "conv1d.weight"] = (2 * nk * dk + nv * dv, 1, kernel)
            out[a + "dt_bias"] = (nv,)
            out[a + "A_log"] = (nv,)
            out[a + "norm.weight"] = (dv,)
            out[a + "out_proj.weight"] = (h, nv * dv)
        else:
            a = p + "self_attn."
            out[a + "q_proj.weight"] = (2 * heads * hd, h)  # queries and the output gate
            out[a + "k_proj.weight"] = (kv_heads * hd, h)
            out[a + "v_proj.weight"] = (kv_heads * hd, h)
            out[a + "o_proj.weight"] = (h, heads * hd)
            out[a + "q_norm.weight"] = (hd,)
            out[a + "k_norm.weight"] = (hd,)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        m = p + "mlp."
        out[m + "gate.weight"] = (experts, h)
        out[m + "shared_expert_gate.weight"] = (1, h)
        for expert, inner in [*((f"experts.{e}.", size) for e in range(experts)),
                              ("shared_expert.", shared)]:
            out[m + expert + "gate_proj.weight"] = (inner, h)
            out[m + expert + "up_proj.weight"] = (inner, h)
            out[m + expert + "down_proj.weight"] = (h, inner)
    return out


def weight_bytes(config: dict[str, Any]) -> int:
    """bf16 bytes of every weight (what model.safetensors holds, less its header)."""
    total = 0
    for shape in shapes(config).values():
        n = 1
        for d in shape:
            n *= d
        total += 2 * n
    return total


def weights(recipe: GeometryModelRecipe, config: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """The state dict (bf16), drawn tensor by tensor in name order from one seeded CPU
    generator: Qwen3-Next's RMS norms are (1 + w) with w = 0, the gated norm's w is 1,
    A_log = log(U(1, 16)) and dt_bias = 1 as transformers initialises them, every matrix
    N(0, init_std)."""
    import torch

    config = config or config_dict(recipe)
    generator = torch.Generator().manual_seed(recipe.seed)
    state: dict[str, Any] = {}
    for name, shape in sorted(shapes(config).items()):
        if name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
            tensor = torch.ones(shape)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            tensor = torch.zeros(shape)
        elif name.endswith("A_log"):
            tensor = torch.empty(shape).uniform_(1.0, 16.0, generator=generator).log_()
        else:
            tensor = torch.empty(shape).normal_(0.0, recipe.init_std, generator=generator)
        state[name] = tensor.to(torch.bfloat16).contiguous()
    return state


@dataclass(frozen=True)
class GeometryModelCard:
    path: Path
    recipe: GeometryModelRecipe
    digest: str
    weight_bytes: int

    def describe(self) -> str:
        return (f"geometry model {self.path.name} (digest {self.digest}, "
                f"{self.weight_bytes / 1e9:.2f} GB of bf16 weights)")


def digest_of(path: Path) -> str:
    """sha256 over config.json, the weights and the canonical tokenizer spec (16 hex)."""
    from pytest_sharedkv.models.copy_model import digest_of as copy_digest

    return copy_digest(path)


def make_geometry_model(dst: Path, recipe: GeometryModelRecipe | None = None
                        ) -> GeometryModelCard:
    """Write the model to DST: config.json, model.safetensors, tokenizer files."""
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, write_model_dir

    recipe = recipe or GeometryModelRecipe()
    config = config_dict(recipe)
    words = CopyModelRecipe(max_position_embeddings=int(config["max_position_embeddings"]))
    write_model_dir(dst, config, weights(recipe, config), words)
    return GeometryModelCard(dst, recipe, digest_of(dst), weight_bytes(config))


def is_geometry_model(path: Path) -> bool:
    from pytest_sharedkv.models.copy_model import model_kind

    return model_kind(path) == KIND
