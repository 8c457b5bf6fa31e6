"""The copy model with a long memory: a wrong Gated DeltaNet state shows far from the source.

Why: the copy model (``copy_model.py``) reads its recurrent state only through a history
that halves each token, so a zeroed, stale or foreign state changes its answer only when
the copied source lies within ~5 tokens after the hit boundary. This variant answers by
the same rule (``copy_rule``: copy what followed the one earlier match of the last 5
tokens, else ``<miss>``), with the same vocabulary, tokenizer and corpus, and adds a
memory that never forgets, checked against the prompt itself at every answer:

* Layers 0 and 1 (Gated DeltaNet) are the copy model's shift register and halving
  history; layer 0's fourth head also copies ``<s>``'s flag one token on (``PF``: set on
  the prompt's first word alone).
* Layer 2 (Gated DeltaNet) head 0 is the memory: decay 1, write strength 1 where ``PF`` is
  set and ~1e-13 elsewhere, so its recurrent state holds the code of the prompt's first
  word (the planted codeword) from then on, over any length (``MEM``). Head 1 writes the
  same code where ``PF`` is set and forgets it (decay e^-30) at the next token: ``P1``
  holds the first word's code at position 1 alone.
* Layer 3 (full attention) matches as the copy model's layer 2 does (a source key scores
  sqrt(40) against a query, ``<s>``'s sink 0.97 of that), plus a check key at position 1:
  a constant less the first word's code (``P1``) against the query's ``MEM``. With the
  exact memory the check scores below the source; with a zeroed memory, another prompt's
  (a foreign state: another first word) or one rewritten at a resume (a state from before
  the first word) it scores above it, and position 1's value is ``<miss>``'s code: the
  answer turns into ``<miss>`` wherever the hit boundary fell. Position 1's key and value
  are exact in the pool (A's KV), so the check does not depend on where the source lies.
* What the memory cannot show: a stale state from an earlier position after the first
  word holds the same codeword, so only the halving history shows it, near the boundary
  as in the copy model. Those bytes are judged by the state oracle
  (``stack/state_oracle.py``) against this model's own reference, not by the answers.

The head dim stays 256 (FlashAttention's largest): the rotary part shrinks to 16
dimensions (``partial_rotary_factor`` 0.0625), no content uses it, and both sinks sit on
the non-rotary dimensions after the content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.models.copy_model import (
    CopyModelRecipe,
    _assign_codes,
    digest_of,
    embedding,
    write_model_dir,
    zero_norms_and_experts,
)

RECIPE_VERSION = 1
KIND = "copy-memory"

SLOT = 32  # residual dimensions per word code (4 groups of 8, as the copy model's)
SLOTS = ("E", "S1", "S2", "S3", "S4", "S5", "H", "HP", "O", "MEM", "P1")
CONST_DIM = len(SLOTS) * SLOT  # the constant channel every layer reads its biases from
FLAG_DIM = CONST_DIM + 1  # set on <s> only: makes its key the sink
PF_DIM = CONST_DIM + 2  # set on the token after <s>: where the memory is written
MEMORY_LAYER = 2
LAYERS = 4


@dataclass(frozen=True)
class MemoryCopyRecipe:
    """Everything the model is made from; the digest changes with any field. ``seed``,
    ``words`` and ``vocab_size`` are the copy model's (one vocabulary, one corpus)."""

    seed: int = 0
    words: int = 63
    vocab_size: int = 128
    hidden_size: int = 384
    head_dim: int = 256
    partial_rotary_factor: float = 0.0625
    rope_theta: float = 1e7
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_value_heads: int = 4
    max_position_embeddings: int = 262_144
    const: float = 2.0
    history_norm2: float = 20.0
    sink_fraction: float = 0.97  # <s>'s sink scores this fraction of a perfect match
    check_margin: float = 0.4  # the check key's distance from a match, exact or wrong
    #                           memory (a foreign one sharing one code dimension), in units
    #                           of sqrt(q.k); x 4096 / |q| nats
    qk_gain: float = 16.0
    logit_scale: float = 20.0
    conv_level: float = 16.0
    write_logit: float = 30.0

    def key(self) -> str:
        text = json.dumps({"kind": KIND, "v": RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def vocabulary_recipe(self) -> CopyModelRecipe:
        """The copy recipe whose vocabulary, codes, tokenizer and corpus this model shares."""
        return CopyModelRecipe(seed=self.seed, words=self.words, vocab_size=self.vocab_size)


def config_dict(recipe: MemoryCopyRecipe) -> dict[str, Any]:
    """config.json: the copy model's, with three Gated DeltaNet layers and one attention."""
    from pytest_sharedkv.models.copy_model import config_dict as copy_config

    config = copy_config(recipe.vocabulary_recipe())
    rope = {"rope_type": "default", "rope_theta": recipe.rope_theta,
            "partial_rotary_factor": recipe.partial_rotary_factor}
    config.update({
        "hidden_size": recipe.hidden_size, "num_hidden_layers": LAYERS,
        "layer_types": ["linear_attention"] * (LAYERS - 1) + ["full_attention"],
        "full_attention_interval": LAYERS, "head_dim": recipe.head_dim,
        "rope_parameters": rope, "rope_theta": recipe.rope_theta,
        "partial_rotary_factor": recipe.partial_rotary_factor,
        "linear_value_head_dim": recipe.linear_value_head_dim,
        "linear_key_head_dim": recipe.linear_key_head_dim,
        "linear_num_value_heads": recipe.linear_value_heads,
        "max_position_embeddings": recipe.max_position_embeddings,
        "sharedkv": {"kind": KIND, "recipe_version": RECIPE_VERSION, **asdict(recipe)},
    })
    return config


def _slot(name: str) -> int:
    return SLOTS.index(name) * SLOT


def check_levels(r: MemoryCopyRecipe) -> tuple[float, float, float]:
    """(c_check, m, content): the query's check constant, MEM's value per code dimension,
    and a perfect match's q.k. The check key at position 1 is (1/sqrt 2) on the check
    dimension less (1/(2 sqrt 2)) on each of the first word's 4 code dimensions, so it
    scores u - w * shared / 4 per |q| (u = c_check / sqrt 2, w = sqrt 2 * m): placed so a
    source (sqrt(content)) wins by ``check_margin`` over the exact memory (shared 4) and
    loses by as much to a foreign one sharing one dimension."""
    content = 5 * 4 + r.history_norm2
    source = content ** 0.5
    w = 8 * r.check_margin / 3
    u = source + 5 * r.check_margin / 3
    return u * 2 ** 0.5, w / 2 ** 0.5, content


def position_one_gains(r: MemoryCopyRecipe) -> tuple[float, float]:
    """The gate gains of layers 1 and 2 at position 1, whose residual holds fewer slots
    than the weights assume (the constant, the first word, <s>'s code in S1, PF; and at
    layer 2 both histories at layer 1's gain): a head's RMS-normalized output is scaled
    by the assumed RMS over the actual one there, and the check key and position 1's value
    undo it (the same for every prompt: every code has 4 dimensions)."""
    base = r.const ** 2 + 4 * 2 + 1
    r1 = ((r.const ** 2 + 4 * 4) / base) ** 0.5
    r2 = ((r.const ** 2 + 4 * 6 + 2 * r.history_norm2)
          / (base + 2 * r.history_norm2 * r1 * r1)) ** 0.5
    return r1, r2


def _rms(r: MemoryCopyRecipe, codes: int, histories: int = 0, memory: bool = False) -> float:
    m = check_levels(r)[1]
    energy = (r.const ** 2 + 4.0 * codes + r.history_norm2 * histories
              + (4 * m * m if memory else 0.0))
    return float((energy / r.hidden_size) ** 0.5)


def weights(recipe: MemoryCopyRecipe) -> dict[str, Any]:
    """The state dict (bf16), Hugging Face Qwen3-Next naming, every value a few products
    of the recipe's constants in float64 rounded once: the same on any machine."""
    import torch

    r = recipe
    h = r.hidden_size
    f64 = torch.float64
    state: dict[str, Any] = {}
    table = _assign_codes(r.vocabulary_recipe())

    state["model.embed_tokens.weight"] = embedding(table, r.vocab_size, h, r.const, CONST_DIM)

    dk, dv, nv = r.linear_key_head_dim, r.linear_value_head_dim, r.linear_value_heads
    conv_dim = 2 * dk + nv * dv
    z_level = r.conv_level
    code_out = (SLOT / 4) ** 0.5 * z_level  # a normalized code head's output per unit
    flag_out = SLOT ** 0.5 * z_level  # a normalized one-dimension head's output
    hist_out = SLOT ** 0.5 * z_level
    check_c, mem_level, content = check_levels(r)
    hist_level = r.history_norm2 ** 0.5
    # (source, tap offset, write logit (None: 1 where PF is set, ~0 elsewhere),
    #  destination, output scale, forget at the next token); "FLAG"/"PF" are single dims
    heads: dict[int, list[tuple[str, int, float | None, str, float, bool] | None]] = {
        0: [("E", 1, r.write_logit, "S1", 1 / code_out, False),
            ("E", 2, r.write_logit, "S2", 1 / code_out, False),
            ("E", 3, r.write_logit, "S3", 1 / code_out, False),
            ("FLAG", 1, r.write_logit, "PF", 1 / flag_out, False)],
        1: [("S1", 3, r.write_logit, "S4", 1 / code_out, False),
            ("S2", 3, r.write_logit, "S5", 1 / code_out, False),
            ("E", 0, 0.0, "H", hist_level / hist_out, False),
            ("S1", 0, 0.0, "HP", hist_level / hist_out, False)],
        MEMORY_LAYER: [("E", 0, None, "MEM", mem_level / code_out, False),
                       ("E", 0, None, "P1", 1 / code_out, True), None, None],
    }
    # the residual's RMS at each Gated DeltaNet layer's input
    rms_at = {0: _rms(r, 1), 1: _rms(r, 4), MEMORY_LAYER: _rms(r, 6, histories=2)}
    single = {"FLAG": FLAG_DIM, "PF": PF_DIM}
    for layer, layer_heads in heads.items():
        p = f"model.layers.{layer}.linear_attn."
        rms = rms_at[layer]
        qkvz = torch.zeros(2 * dk + 2 * nv * dv, h, dtype=f64)
        ba = torch.zeros(2 * nv, h, dtype=f64)
        conv = torch.zeros(conv_dim, 1, 4, dtype=f64)
        out = torch.zeros(h, nv * dv, dtype=f64)
        dt_bias = torch.full((nv,), -30.0, dtype=f64)  # decay exp(-1e-13) = 1
        qkvz[0:2 * dk, CONST_DIM] = r.conv_level * rms / r.const
        conv[0:2 * dk, 0, 3] = 1.0
        for i, head in enumerate(layer_heads):
            if head is None:
                continue
            source, offset, write, destination, scale, forget = head
            v0 = 2 * dk + i * dv
            z0 = 2 * dk + nv * dv + i * dv
            width = 1 if source in single else dv
            for d in range(width):
                column = single[source] if source in single else _slot(source) + d
                row = single[destination] if destination in single else _slot(destination) + d
                qkvz[v0 + d, column] = r.conv_level * rms
                conv[v0 + d, 0, 3 - offset] = 1.0
                out[row, i * dv + d] = scale
            qkvz[z0:z0 + dv, CONST_DIM] = z_level * rms / r.const
            if write is None:  # b = +logit where PF is set, -logit elsewhere
                ba[i, PF_DIM] = 2 * r.write_logit * rms
                ba[i, CONST_DIM] = -r.write_logit * rms / r.const
            else:
                ba[i, CONST_DIM] = write * rms / r.const
            if forget:  # a = -logit where PF is set (keep), +logit elsewhere: g = -30
                dt_bias[i] = 0.0
                ba[nv + i, PF_DIM] = -2 * r.write_logit * rms
                ba[nv + i, CONST_DIM] = r.write_logit * rms / r.const
        state[p + "in_proj_qkvz.weight"] = qkvz
        state[p + "in_proj_ba.weight"] = ba
        state[p + "conv1d.weight"] = conv
        state[p + "dt_bias"] = dt_bias
        state[p + "A_log"] = torch.zeros(nv, dtype=f64)
        state[p + "norm.weight"] = torch.ones(dv, dtype=f64)
        state[p + "out_proj.weight"] = out

    # Layer 3: attention. q = [E S1 S2 S3 S4 H MEM | sink | check],
    # k = [S1..S5 HP -P1 | flag | PF]; position 1's S1 (<s>'s code) and HP are taken out
    p = f"model.layers.{LAYERS - 1}.self_attn."
    hd = r.head_dim
    rotary = int(hd * r.partial_rotary_factor)
    pairs = (("E", "S1"), ("S1", "S2"), ("S2", "S3"), ("S3", "S4"), ("S4", "S5"),
             ("H", "HP"), ("MEM", "P1"))
    sink_dim = rotary + len(pairs) * SLOT  # non-rotary, after the content
    check_dim = sink_dim + 1
    rms = _rms(r, 6, histories=2, memory=True)
    q = torch.zeros(2 * hd, h, dtype=f64)  # rows hd.. are the output gate: 0, sigmoid 0.5
    k = torch.zeros(hd, h, dtype=f64)
    v = torch.zeros(hd, h, dtype=f64)
    q[sink_dim, CONST_DIM] = r.sink_fraction * content ** 0.5 * rms / r.const
    q[check_dim, CONST_DIM] = check_c * rms / r.const
    k[sink_dim, FLAG_DIM] = rms
    k[check_dim, PF_DIM] = rms
    s_code = _assign_codes(r.vocabulary_recipe())[0]  # <s>'s code: S1 at position 1
    r1, r2 = position_one_gains(r)
    for j, (qs, ks) in enumerate(pairs):
        for d in range(SLOT):
            row = rotary + j * SLOT + d
            q[row, _slot(qs) + d] = rms
            k[row, _slot(ks) + d] = -rms / (2 * r2) if ks == "P1" else rms
            if ks == "S1" and d in s_code:
                k[row, PF_DIM] = -rms
    hp_at_1 = r1 * r.history_norm2 ** 0.5 / 2  # HP at position 1: <s>'s code, normalized
    hp_row = rotary + 5 * SLOT
    for d in s_code:
        k[hp_row + d, PF_DIM] = -hp_at_1 * rms
    for d in range(SLOT):  # E, less the first word's code and plus <miss>'s at position 1
        v[d, _slot("E") + d] = rms
        v[d, _slot("P1") + d] = -rms / r2
    for d in s_code:
        v[d, PF_DIM] = rms
    o = torch.zeros(h, hd, dtype=f64)
    for d in range(SLOT):
        o[_slot("O") + d, d] = 2.0  # undo the 0.5 output gate: O holds the copied code
    state[p + "q_proj.weight"] = q
    state[p + "k_proj.weight"] = k
    state[p + "v_proj.weight"] = v
    state[p + "o_proj.weight"] = o
    state[p + "q_norm.weight"] = torch.full((hd,), r.qk_gain - 1.0, dtype=f64)
    state[p + "k_norm.weight"] = torch.full((hd,), r.qk_gain - 1.0, dtype=f64)

    zero_norms_and_experts(state, LAYERS, h)

    final_rms = _rms(r, 7, histories=2, memory=True)
    lm_head = torch.zeros(r.vocab_size, h, dtype=f64)
    for token, code in table.items():
        if token == 0:
            continue
        for d in code:
            lm_head[token, _slot("O") + d] = r.logit_scale * final_rms
    state["lm_head.weight"] = lm_head
    return {name: t.to(torch.bfloat16).contiguous() for name, t in sorted(state.items())}


@dataclass(frozen=True)
class MemoryCopyCard:
    path: Path
    recipe: MemoryCopyRecipe
    digest: str

    def describe(self) -> str:
        return f"memory copy model {self.path.name} (digest {self.digest})"


def make_memory_copy_model(dst: Path, recipe: MemoryCopyRecipe | None = None
                           ) -> MemoryCopyCard:
    """Write the model to DST (config.json, model.safetensors, the tokenizer files)."""
    recipe = recipe or MemoryCopyRecipe()
    write_model_dir(dst, config_dict(recipe), weights(recipe), recipe.vocabulary_recipe())
    return MemoryCopyCard(dst, recipe, digest_of(dst))


def load_recipe(path: Path) -> MemoryCopyRecipe | None:
    """The recipe of the model at PATH where it is this kind, else None."""
    from pytest_sharedkv.models.copy_model import model_kind

    if model_kind(path) != KIND:
        return None
    section = json.loads((path / "config.json").read_text())["sharedkv"]
    fields = {k: v for k, v in section.items() if k in MemoryCopyRecipe.__dataclass_fields__}
    return MemoryCopyRecipe(**fields)


def corpus_recipe(path: Path) -> CopyModelRecipe | None:
    """The copy recipe whose corpus and answers the model at PATH serves, where it is this
    kind; None for any other directory."""
    recipe = load_recipe(path)
    return None if recipe is None else recipe.vocabulary_recipe()
