"""The copy model with attention layers only, for the stacks that refuse a hybrid model.

Why: vLLM 0.26 turns its hybrid KV cache manager off for a connector that does not
implement ``SupportsHMA`` (LMCache's in-process ``LMCacheConnectorV1`` does not), and a
Gated DeltaNet model then fails at startup ("Hybrid KV cache manager is disabled but failed
to convert the KV cache specs to one unified type"). This variant answers by the same rule
(``copy_rule``: copy what followed the one earlier match of the last 5 tokens, else
``<miss>``) with the same vocabulary and tokenizer, so the copy corpus and its expected
answers serve it unchanged. Its weights are set by hand, as the hybrid's are:

* Layer 0 (5 heads, Qwen3 attention): head k copies the word code of the token k back into
  its own residual slot. Its query and key are constants in the fastest rotary pairs,
  the key turned by k steps, so the score peaks at a distance of exactly k; the tenth
  pair's frequency keeps every other distance up to ``max_position_embeddings`` at least
  ``shift_gap`` below it (``shift_curve`` computes this, the self-test checks it).
  ``<s>`` holds no word code, so a head that reaches back past the start copies nothing.
* Layer 1 (1 head): the hybrid's match, on the slowest rotary pairs (Qwen3 rotates the
  whole head; a rope base of 1e24 turns those pairs by under 1e-3 rad over the context):
  the current 5-token context against every earlier position's preceding 5 tokens, a sink
  on ``<s>`` just under a perfect match (``<s>``'s value is ``<miss>``'s code), and the
  word found is copied to the output slot.
* The MLPs are zero.

The KV a transfer corrupts lives in both layers: a lost or foreign source chunk turns the
answer into ``<miss>`` (layer 1's keys), and so does a wrong chunk under the prompt's last
five tokens (layer 0's). Chunks permuted within one prompt are invisible, as for the hybrid.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.models.copy_model import (
    CopyModelRecipe,
    _assign_codes,
    digest_of,
    write_model_dir,
)
from pytest_sharedkv.models.copy_rule import CONTEXT

RECIPE_VERSION = 1
KIND = "copy-attention"

GROUP = 32  # residual dimensions per word code (4 groups of 8, as the hybrid's)
SLOTS = ("E", *(f"S{k}" for k in range(1, CONTEXT + 1)), "M", "O")  # M: <s>'s <miss> code
CONST_DIM = len(SLOTS) * GROUP
FLAG_DIM = CONST_DIM + 1  # set on <s> only: makes its key the sink


@dataclass(frozen=True)
class AttentionCopyRecipe:
    """Everything the model is made from; the digest changes with any field. ``seed``,
    ``words`` and ``vocab_size`` are the hybrid copy model's (one vocabulary, one corpus)."""

    seed: int = 0
    words: int = 63
    vocab_size: int = 128
    hidden_size: int = 320
    head_dim: int = 256  # FlashAttention's largest
    rope_theta: float = 1e24
    shift_pairs: int = 10  # the fastest rotary pairs the shift heads use
    max_position_embeddings: int = 262_144
    const: float = 2.0  # the constant channel's value
    shift_gain: float = 8.0  # q/k norm gain of layer 0: peak score 16 * gain^2
    match_gain: float = 16.0  # q/k norm gain of layer 1
    sink_fraction: float = 0.97  # the sink scores this fraction of a perfect match
    logit_scale: float = 20.0  # lm_head: nats per shared code dimension

    def key(self) -> str:
        text = json.dumps({"kind": KIND, "v": RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def vocabulary_recipe(self) -> CopyModelRecipe:
        """The hybrid recipe whose vocabulary, codes and tokenizer this model shares."""
        return CopyModelRecipe(seed=self.seed, words=self.words, vocab_size=self.vocab_size,
                               max_position_embeddings=self.max_position_embeddings)


def _slot(name: str) -> int:
    return SLOTS.index(name) * GROUP


def inverse_frequencies(recipe: AttentionCopyRecipe) -> list[float]:
    """Each rotary pair's angle per position, as vLLM and transformers compute them."""
    half = recipe.head_dim // 2
    return [recipe.rope_theta ** (-i / half) for i in range(half)]


def content_pairs(recipe: AttentionCopyRecipe) -> range:
    """The slow rotary pairs that carry layer 1's codes (both halves of each), below the
    sink's pair (the slowest)."""
    half = recipe.head_dim // 2
    pairs = CONTEXT * GROUP // 2
    return range(half - 1 - pairs, half - 1)


def shift_curve(recipe: AttentionCopyRecipe, offsets: range) -> list[float]:
    """A shift head's score at each OFFSET from its target (negative: nearer the query),
    as a fraction of the peak: the mean cosine over its rotary pairs."""
    freqs = inverse_frequencies(recipe)[:recipe.shift_pairs]
    return [sum(math.cos(f * d) for f in freqs) / len(freqs) for d in offsets]


def shift_gap(recipe: AttentionCopyRecipe, span: int | None = None) -> float:
    """The least fraction of the peak by which any other position up to SPAN (default:
    the model's context) scores below a shift head's target: the head's margin is this
    times its peak score. Computed with torch over every distance."""
    import torch

    span = recipe.max_position_embeddings if span is None else span
    freqs = torch.tensor(inverse_frequencies(recipe)[:recipe.shift_pairs],
                         dtype=torch.float64)
    gap = 1.0
    for start in range(-CONTEXT, span + 1, 1 << 16):
        d = torch.arange(start, min(start + (1 << 16), span + 1), dtype=torch.float64)
        d = d[d != 0]
        if len(d):
            curve = torch.cos(d[:, None] * freqs[None, :]).mean(dim=1)
            gap = min(gap, 1.0 - float(curve.max()))
    return gap


def shift_peak(recipe: AttentionCopyRecipe) -> float:
    """A shift head's score at its target (nats): q and k normalized to gain^2 per
    dimension, scaled by head_dim^-1/2."""
    return math.sqrt(recipe.head_dim) * recipe.shift_gain ** 2


def config_dict(recipe: AttentionCopyRecipe) -> dict[str, Any]:
    """config.json: a Qwen3 (attention only), readable by transformers and vLLM 0.26."""
    heads = CONTEXT
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": recipe.vocab_size, "hidden_size": recipe.hidden_size,
        "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": heads, "num_key_value_heads": heads,
        "head_dim": recipe.head_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": recipe.rope_theta},
        "rope_theta": recipe.rope_theta,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False,
        "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": 2,
        "max_position_embeddings": recipe.max_position_embeddings,
        "tie_word_embeddings": False, "use_cache": True,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "dtype": "bfloat16", "torch_dtype": "bfloat16",
        "sharedkv": {"kind": KIND, "recipe_version": RECIPE_VERSION, **asdict(recipe)},
    }


def weights(recipe: AttentionCopyRecipe) -> dict[str, Any]:
    """The state dict (bf16) in the Hugging Face Qwen3 naming: a few products of the
    recipe's constants in float64, rounded once, no random numbers."""
    import torch

    r = recipe
    h, hd, heads = r.hidden_size, r.head_dim, CONTEXT
    half = hd // 2
    f64 = torch.float64
    table = _assign_codes(r.vocabulary_recipe())  # the hybrid's codes
    state: dict[str, Any] = {}

    embed = torch.zeros(r.vocab_size, h, dtype=f64)
    embed[:, CONST_DIM] = r.const
    for token, code in table.items():
        if token == 0:  # <s>: no word code for the shift heads, <miss>'s code to be copied
            embed[0, [_slot("M") + d for d in code]] = 1.0
        else:
            embed[token, [_slot("E") + d for d in code]] = 1.0
    embed[0, FLAG_DIM] = 1.0
    state["model.embed_tokens.weight"] = embed

    def rms(codes: int) -> float:  # the residual's RMS with CODES word codes filled
        return math.sqrt((r.const ** 2 + 4.0 * codes) / h)

    freqs = inverse_frequencies(r)
    layer_rms = (rms(1), rms(1 + CONTEXT))  # at each layer's input, all slots filled

    # Layer 0: head n copies E from n+1 tokens back into S(n+1).
    p = "model.layers.0.self_attn."
    q = torch.zeros(heads * hd, h, dtype=f64)
    k = torch.zeros(heads * hd, h, dtype=f64)
    v = torch.zeros(heads * hd, h, dtype=f64)
    o = torch.zeros(h, heads * hd, dtype=f64)
    for n in range(heads):
        back = n + 1
        for i in range(r.shift_pairs):
            q[n * hd + i, CONST_DIM] = 1.0  # normalized by q_norm: only the direction counts
            k[n * hd + i, CONST_DIM] = math.cos(freqs[i] * back)
            k[n * hd + half + i, CONST_DIM] = math.sin(freqs[i] * back)
        for d in range(GROUP):
            v[n * hd + d, _slot("E") + d] = layer_rms[0]
            o[_slot(f"S{back}") + d, n * hd + d] = 1.0
    state.update({p + "q_proj.weight": q, p + "k_proj.weight": k, p + "v_proj.weight": v,
                  p + "o_proj.weight": o,
                  p + "q_norm.weight": torch.full((hd,), r.shift_gain, dtype=f64),
                  p + "k_norm.weight": torch.full((hd,), r.shift_gain, dtype=f64)})

    # Layer 1, head 0: q = [sink | E S1..S4], k = [flag | S1..S5], v = E (or <s>'s M).
    p = "model.layers.1.self_attn."
    q = torch.zeros(heads * hd, h, dtype=f64)
    k = torch.zeros(heads * hd, h, dtype=f64)
    v = torch.zeros(heads * hd, h, dtype=f64)
    o = torch.zeros(h, heads * hd, dtype=f64)
    pairs = content_pairs(r)
    dims = [*pairs, *(half + i for i in pairs)]  # 160: five codes of 32
    queries = ("E", *(f"S{j}" for j in range(1, CONTEXT)))
    keys = tuple(f"S{j}" for j in range(1, CONTEXT + 1))
    for j, (qs, ks) in enumerate(zip(queries, keys, strict=True)):
        for d in range(GROUP):
            q[dims[j * GROUP + d], _slot(qs) + d] = 1.0
            k[dims[j * GROUP + d], _slot(ks) + d] = 1.0
    sink = half - 1  # the slowest pair
    content = CONTEXT * 4  # q.k of a perfect match, in code dimensions
    q[sink, CONST_DIM] = r.sink_fraction * math.sqrt(content) / r.const
    k[sink, FLAG_DIM] = 1.0
    for d in range(GROUP):
        v[d, _slot("E") + d] = layer_rms[1]
        v[d, _slot("M") + d] = layer_rms[1]
        o[_slot("O") + d, d] = 1.0
    state.update({p + "q_proj.weight": q, p + "k_proj.weight": k, p + "v_proj.weight": v,
                  p + "o_proj.weight": o,
                  p + "q_norm.weight": torch.full((hd,), r.match_gain, dtype=f64),
                  p + "k_norm.weight": torch.full((hd,), r.match_gain, dtype=f64)})

    for layer in range(2):
        p = f"model.layers.{layer}."
        state[p + "input_layernorm.weight"] = torch.ones(h, dtype=f64)
        state[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=f64)
        state[p + "mlp.gate_proj.weight"] = torch.zeros(64, h, dtype=f64)
        state[p + "mlp.up_proj.weight"] = torch.zeros(64, h, dtype=f64)
        state[p + "mlp.down_proj.weight"] = torch.zeros(h, 64, dtype=f64)
    state["model.norm.weight"] = torch.ones(h, dtype=f64)

    final_rms = rms(2 + CONTEXT)  # E, S1..S5 and the copied code in O
    lm_head = torch.zeros(r.vocab_size, h, dtype=f64)
    for token, code in table.items():
        if token == 0:
            continue  # <s> is never predicted; <miss> carries codeword 0
        for d in code:
            lm_head[token, _slot("O") + d] = r.logit_scale * final_rms
    state["lm_head.weight"] = lm_head
    return {name: t.to(torch.bfloat16).contiguous() for name, t in sorted(state.items())}


@dataclass(frozen=True)
class AttentionCopyCard:
    path: Path
    recipe: AttentionCopyRecipe
    digest: str

    def describe(self) -> str:
        return f"attention-only copy model {self.path.name} (digest {self.digest})"


def make_attention_copy_model(dst: Path, recipe: AttentionCopyRecipe | None = None
                              ) -> AttentionCopyCard:
    """Write the model to DST (config.json, model.safetensors, the tokenizer files)."""
    recipe = recipe or AttentionCopyRecipe()
    write_model_dir(dst, config_dict(recipe), weights(recipe), recipe.vocabulary_recipe())
    return AttentionCopyCard(dst, recipe, digest_of(dst))


def corpus_recipe(path: Path) -> CopyModelRecipe | None:
    """The hybrid recipe whose copy corpus and answers the model at PATH serves, where it
    is this kind (its vocabulary recipe); None for any other directory."""
    from pytest_sharedkv.models.copy_model import model_kind

    if model_kind(path) != KIND:
        return None
    section = json.loads((path / "config.json").read_text())["sharedkv"]
    fields = {k: v for k, v in section.items() if k in AttentionCopyRecipe.__dataclass_fields__}
    return AttentionCopyRecipe(**fields).vocabulary_recipe()
