"""A KV-sensitive hybrid model, built by construction: it copies from its context.

Why: a random-weight model answers from its last token (a bigram model in effect, greedy
margins ~0.03 nats), so it gives the same answer on corrupted KV and a service check on it
proves nothing. This model's weights are set by hand (no training, no random numbers) so
that its greedy answer depends exactly on the cached KV and Gated DeltaNet state:

* Every word has a code: 4 of 32 dimensions, one per group of 8, from a Reed-Solomon code
  over GF(8), so two words share at most one dimension.
* Layer 0 (Gated DeltaNet) is a shift register: its causal convolution copies the codes of
  the previous 1, 2 and 3 tokens into their own residual slots (constant q/k, write
  strength 1, so the recurrent state holds only the newest value).
* Layer 1 (Gated DeltaNet) shifts those by 3 more (the tokens 4 and 5 back) and keeps a
  decaying history of the codes in its recurrent state (write strength 1/2) for the current
  token and, one token behind, for keys.
* Layer 2 (full attention) matches the current 5-token context and history against every
  earlier position's preceding 5 tokens and history, using only non-rotary dimensions, and
  copies the word found there; q/k norm gains make the match worth tens of nats.
* A sink key on ``<s>`` scores just under a perfect match, so a query that is off in any
  part (a lost or foreign chunk, a zeroed or stale convolution or recurrent state) lands on
  the sink and the model says ``<miss>``: the answer changes instead of degrading.
* The MoE blocks are present (vLLM's Qwen3-Next needs them) and zeroed.

A prompt is ``<s>`` + seeded random words + an 8-word cue copied from a source position;
the expected continuation is the words that followed the source, known by construction.
Attention sees (key, value) pairs with their content only, so chunks permuted within one
prompt are invisible; lost or foreign content is not.

The digest covers the config, the weights and the vocabulary as this module writes them
(canonical JSON, safetensors with sorted keys), not ``tokenizer.json``, whose bytes depend
on the tokenizers version: the same recipe gives the same digest on any machine.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECIPE_VERSION = 1
KIND = "copy"

BOS, EOS, PAD, UNK, MISS = "<s>", "</s>", "<pad>", "<unk>", "<miss>"
WORD_MARK = "\u2581"  # the Metaspace marker: text "w01 w02" <-> tokens "▁w01", "▁w02"
SPECIALS = (BOS, EOS, PAD, UNK)  # ids 0..3; MISS (id 4) is an ordinary, visible word
CODE_GROUPS = 4  # a code is one dimension in each group: Reed-Solomon (4, 2) over GF(8)
GROUP_SIZE = 8
SLOT = CODE_GROUPS * GROUP_SIZE  # 32 residual dimensions per slot
SLOTS = ("E", "S1", "S2", "S3", "S4", "S5", "H", "HP", "O")  # HP: the history one behind
CONST_DIM = len(SLOTS) * SLOT  # a constant channel every layer reads its biases from
FLAG_DIM = CONST_DIM + 1  # set on <s> only: makes its key the sink
SINK_DIM = 31  # q/k dimension of the sink: the slowest rotary pair (q/k content is 0 there)

# GF(8) with x^3 + x + 1: multiplication table from the polynomial, no floating point.
_GF8_MUL = [[0] * 8 for _ in range(8)]
for _a in range(8):
    for _b in range(8):
        _p, _x, _y = 0, _a, _b
        while _y:
            if _y & 1:
                _p ^= _x
            _y >>= 1
            _x <<= 1
            if _x & 8:
                _x ^= 0b1011
        _GF8_MUL[_a][_b] = _p


def codes() -> list[tuple[int, ...]]:
    """64 codewords (a + b*x at x = 0, 1, 2, 3 over GF(8)) as dimension indices in 0..31;
    any two share at most one dimension. Codeword (0, 0) is ``<s>``'s."""
    out = []
    for a in range(8):
        for b in range(8):
            out.append(tuple(group * GROUP_SIZE + (a ^ _GF8_MUL[b][x])
                             for group, x in enumerate(range(CODE_GROUPS))))
    return out


@dataclass(frozen=True)
class CopyModelRecipe:
    """Everything the model is made from; the digest changes with any field."""

    seed: int = 0  # which code each word gets
    words: int = 63  # content words w00..w62 (codewords other than <s>'s)
    vocab_size: int = 128
    hidden_size: int = 320
    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    rope_theta: float = 1e7  # the sink's rotary pair turns < 0.03 rad over 128k tokens
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_value_heads: int = 4
    max_position_embeddings: int = 262_144
    const: float = 2.0  # the constant channel's value
    history_norm2: float = 20.0  # |H|^2, against 4 per word code
    sink_fraction: float = 0.97  # the sink scores this fraction of a perfect match
    qk_gain: float = 16.0  # q/k norm gain (1 + weight): score per unit of cosine 16*gain^2
    logit_scale: float = 20.0  # lm_head: nats per shared code dimension, after the norm
    conv_level: float = 16.0  # codes enter the convolution at this level: SiLU is ~linear
    write_logit: float = 30.0  # sigmoid(30) = 1: shift heads overwrite their state

    def key(self) -> str:
        text = json.dumps({"kind": KIND, "v": RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def vocabulary(recipe: CopyModelRecipe) -> list[str]:
    """Token strings by id: specials, ``<miss>``, then the words."""
    words = [f"w{i:02d}" for i in range(recipe.words)]
    return [*SPECIALS, WORD_MARK + MISS, *(WORD_MARK + w for w in words)]


def word_ids(recipe: CopyModelRecipe) -> range:
    """Token ids of the content words (what prompts are made of)."""
    first = len(SPECIALS) + 1
    return range(first, first + recipe.words)


def text_of(ids: list[int], recipe: CopyModelRecipe) -> str:
    """Prompt text for word ids (the tokenizer adds ``<s>``)."""
    vocab = vocabulary(recipe)
    return " ".join(vocab[i].removeprefix(WORD_MARK) for i in ids)


def ids_of(text: str, recipe: CopyModelRecipe) -> list[int]:
    """Word ids of a text the model wrote (or a prompt); unknown words give -1."""
    index = {token.removeprefix(WORD_MARK): i for i, token in enumerate(vocabulary(recipe))}
    return [index.get(word, -1) for word in text.split()]


def _assign_codes(recipe: CopyModelRecipe) -> dict[int, tuple[int, ...]]:
    """Token id -> code: <s> and <miss> get codeword 0, words a seeded shuffle of the rest."""
    table = codes()
    rest = table[1:]
    random.Random(recipe.seed).shuffle(rest)
    out = {0: table[0], len(SPECIALS): table[0]}
    for token, code in zip(word_ids(recipe), rest, strict=False):
        out[token] = code
    return out


def config_dict(recipe: CopyModelRecipe) -> dict[str, Any]:
    """config.json, readable by transformers (CPU self-tests) and vLLM 0.26 alike."""
    rope = {"rope_type": "default", "rope_theta": recipe.rope_theta,
            "partial_rotary_factor": recipe.partial_rotary_factor}
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": recipe.vocab_size, "hidden_size": recipe.hidden_size,
        "intermediate_size": 64, "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "linear_attention", "full_attention"],
        "full_attention_interval": 3,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": recipe.head_dim,
        "rope_parameters": rope, "rope_theta": recipe.rope_theta,
        "partial_rotary_factor": recipe.partial_rotary_factor,
        "linear_num_key_heads": 1, "linear_num_value_heads": recipe.linear_value_heads,
        "linear_key_head_dim": recipe.linear_key_head_dim,
        "linear_value_head_dim": recipe.linear_value_head_dim, "linear_conv_kernel_dim": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "attention_bias": False, "attention_dropout": 0.0,
        "max_position_embeddings": recipe.max_position_embeddings,
        "tie_word_embeddings": False, "use_cache": True,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "dtype": "bfloat16", "torch_dtype": "bfloat16",
        "sharedkv": {"kind": KIND, "recipe_version": RECIPE_VERSION, **asdict(recipe)},
    }


@dataclass(frozen=True)
class Levels:
    """RMS of the residual at each layer's input, for a position with every slot filled."""

    hidden: int
    const: float
    history_norm2: float

    def rms(self, filled_codes: int, histories: int = 0) -> float:
        energy = self.const ** 2 + 4.0 * filled_codes + self.history_norm2 * histories
        return float((energy / self.hidden) ** 0.5)


def _slot(name: str) -> int:
    return SLOTS.index(name) * SLOT


def weights(recipe: CopyModelRecipe) -> dict[str, Any]:
    """The state dict (bf16), in the Hugging Face Qwen3-Next naming vLLM loads.

    Every value is a few products of the recipe's constants, computed in float64 and
    rounded once to bf16: no matrix products, no random numbers, the same on any machine.
    """
    import torch

    r = recipe
    h = r.hidden_size
    levels = Levels(h, r.const, r.history_norm2)
    f64 = torch.float64
    state: dict[str, Any] = {}
    table = _assign_codes(r)

    state["model.embed_tokens.weight"] = embedding(table, r.vocab_size, h, r.const)

    dk, dv, nv = r.linear_key_head_dim, r.linear_value_head_dim, r.linear_value_heads
    conv_dim = 2 * dk + nv * dv
    # a normalized shift head writes code * sqrt(SLOT / 4) * silu(z) per dimension
    z_level = r.conv_level
    code_out = (SLOT / 4) ** 0.5 * z_level
    hist_out = SLOT ** 0.5 * z_level  # a history head's output norm

    # (layer, head) -> (source slot, tap offset, write logit, destination slot, out scale)
    heads: dict[int, list[tuple[str, int, float, str, float] | None]] = {
        0: [("E", 1, r.write_logit, "S1", 1 / code_out),
            ("E", 2, r.write_logit, "S2", 1 / code_out),
            ("E", 3, r.write_logit, "S3", 1 / code_out), None],
        1: [("S1", 3, r.write_logit, "S4", 1 / code_out),
            ("S2", 3, r.write_logit, "S5", 1 / code_out),
            ("E", 0, 0.0, "H", r.history_norm2 ** 0.5 / hist_out),
            ("S1", 0, 0.0, "HP", r.history_norm2 ** 0.5 / hist_out)],
    }
    filled = {0: 1, 1: 4}  # codes in the residual at each GDN layer's input
    for layer, layer_heads in heads.items():
        p = f"model.layers.{layer}.linear_attn."
        rms = levels.rms(filled[layer])
        qkvz = torch.zeros(2 * dk + 2 * nv * dv, h, dtype=f64)
        ba = torch.zeros(2 * nv, h, dtype=f64)
        conv = torch.zeros(conv_dim, 1, 4, dtype=f64)
        out = torch.zeros(h, nv * dv, dtype=f64)
        # q and k: a constant from the constant channel, through tap 0 of the convolution
        qkvz[0:2 * dk, CONST_DIM] = r.conv_level * rms / r.const
        conv[0:2 * dk, 0, 3] = 1.0
        for i, head in enumerate(layer_heads):
            if head is None:
                continue
            source, offset, write, destination, scale = head
            v0 = 2 * dk + i * dv  # this head's value rows (and conv channels)
            z0 = 2 * dk + nv * dv + i * dv
            for d in range(dv):
                qkvz[v0 + d, _slot(source) + d] = r.conv_level * rms
                conv[v0 + d, 0, 3 - offset] = 1.0
                out[_slot(destination) + d, i * dv + d] = scale
            qkvz[z0:z0 + dv, CONST_DIM] = z_level * rms / r.const
            ba[i, CONST_DIM] = write * rms / r.const  # b: write strength sigmoid(b)
        state[p + "in_proj_qkvz.weight"] = qkvz
        state[p + "in_proj_ba.weight"] = ba
        state[p + "conv1d.weight"] = conv
        state[p + "dt_bias"] = torch.full((nv,), -30.0, dtype=f64)  # decay exp(-1e-13) = 1
        state[p + "A_log"] = torch.zeros(nv, dtype=f64)
        state[p + "norm.weight"] = torch.ones(dv, dtype=f64)
        state[p + "out_proj.weight"] = out

    # Layer 2: attention. q = [sink const | E S1 S2 S3 S4 H], k = [sink flag | S1..S5 HP]
    p = "model.layers.2.self_attn."
    hd = r.head_dim
    rms = levels.rms(6, histories=2)  # E, S1..S5 and both histories
    content = 5 * 4 + r.history_norm2  # q.k of a perfect match: five codes and the history
    c_q = r.sink_fraction * content ** 0.5  # score(sink) = sink_fraction * score(match)
    rotary = int(hd * r.partial_rotary_factor)
    q = torch.zeros(2 * hd, h, dtype=f64)  # rows hd.. are the output gate: 0, sigmoid 0.5
    k = torch.zeros(hd, h, dtype=f64)
    v = torch.zeros(hd, h, dtype=f64)
    q[SINK_DIM, CONST_DIM] = c_q * rms / r.const
    k[SINK_DIM, FLAG_DIM] = 1.0
    hist = 1.0  # the history slots already hold norm sqrt(history_norm2)
    for j, (qs, ks) in enumerate(zip(("E", "S1", "S2", "S3", "S4", "H"),
                                     ("S1", "S2", "S3", "S4", "S5", "HP"), strict=True)):
        for d in range(SLOT):
            row = rotary + j * SLOT + d
            q[row, _slot(qs) + d] = rms * (hist if qs == "H" else 1.0)
            k[row, _slot(ks) + d] = rms
    for d in range(SLOT):
        v[d, _slot("E") + d] = rms
    o = torch.zeros(h, hd, dtype=f64)
    for d in range(SLOT):
        o[_slot("O") + d, d] = 2.0  # undo the 0.5 output gate: O holds the copied code
    state[p + "q_proj.weight"] = q
    state[p + "k_proj.weight"] = k
    state[p + "v_proj.weight"] = v
    state[p + "o_proj.weight"] = o
    state[p + "q_norm.weight"] = torch.full((hd,), r.qk_gain - 1.0, dtype=f64)
    state[p + "k_norm.weight"] = torch.full((hd,), r.qk_gain - 1.0, dtype=f64)

    zero_norms_and_experts(state, 3, h)

    final_rms = levels.rms(7, histories=2)  # and the copied code in O
    lm_head = torch.zeros(r.vocab_size, h, dtype=f64)
    for token, code in table.items():
        if token == 0:
            continue  # <s> is never predicted; <miss> carries its code
        for d in code:
            lm_head[token, _slot("O") + d] = r.logit_scale * final_rms
    state["lm_head.weight"] = lm_head
    return {name: t.to(torch.bfloat16).contiguous() for name, t in sorted(state.items())}


def embedding(table: dict[int, tuple[int, ...]], vocab_size: int, h: int, const: float,
              const_dim: int = CONST_DIM) -> Any:
    """The copy models' embedding: every token the constant in CONST_DIM (a model of more
    slots puts it further on) and its code's dimensions at 1, the start token <s> (id 0)
    also its flag, the dimension after the constant."""
    import torch

    embed = torch.zeros(vocab_size, h, dtype=torch.float64)
    embed[:, const_dim] = const
    for token, code in table.items():
        embed[token, list(code)] = 1.0
    embed[0, const_dim + 1] = 1.0
    return embed


def zero_norms_and_experts(state: dict[str, Any], layers: int, h: int) -> None:
    """Every layer's norms and its MoE block (4 experts and the shared one, vLLM's
    Qwen3-Next needs one) zero, and the final norm: the residual stream passes unchanged
    through what the copy models do not use (Qwen3-Next's norms scale by 1 + weight)."""
    import torch

    f64 = torch.float64
    for layer in range(layers):
        p = f"model.layers.{layer}."
        state[p + "input_layernorm.weight"] = torch.zeros(h, dtype=f64)
        state[p + "post_attention_layernorm.weight"] = torch.zeros(h, dtype=f64)
        m = p + "mlp."
        state[m + "gate.weight"] = torch.zeros(4, h, dtype=f64)
        state[m + "shared_expert_gate.weight"] = torch.zeros(1, h, dtype=f64)
        for expert in (*(f"experts.{e}." for e in range(4)), "shared_expert."):
            state[m + expert + "gate_proj.weight"] = torch.zeros(64, h, dtype=f64)
            state[m + expert + "up_proj.weight"] = torch.zeros(64, h, dtype=f64)
            state[m + expert + "down_proj.weight"] = torch.zeros(h, 64, dtype=f64)
    state["model.norm.weight"] = torch.zeros(h, dtype=f64)


def _tokenizer_spec(recipe: CopyModelRecipe) -> dict[str, Any]:
    return {"model": "WordLevel", "vocab": vocabulary(recipe), "unk": UNK,
            "pre_tokenizer": "Metaspace(always)", "post": "<s> $A", "bos": BOS,
            "eos": EOS, "pad": PAD}


def write_tokenizer(dst: Path, recipe: CopyModelRecipe) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(vocabulary(recipe))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_MARK,
                                                       prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement=WORD_MARK, prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD, unk_token=UNK)
    fast.model_max_length = recipe.max_position_embeddings
    fast.save_pretrained(dst)


@dataclass(frozen=True)
class CopyModelCard:
    path: Path
    recipe: CopyModelRecipe
    digest: str

    def describe(self) -> str:
        return f"copy model {self.path.name} (digest {self.digest})"


def digest_of(path: Path) -> str:
    """sha256 over config.json, the weights and the canonical tokenizer spec (16 hex)."""
    parts = [path / "config.json", path / "model.safetensors", path / "sharedkv-tokenizer.json"]
    joined = "".join(hashlib.sha256(p.read_bytes()).hexdigest() for p in parts)
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def write_model_dir(dst: Path, config: dict[str, Any], state: dict[str, Any] | None,
                    words: CopyModelRecipe) -> None:
    """A generated model's files in DST (config.json, generation_config.json,
    model.safetensors, the canonical tokenizer spec and the tokenizer for WORDS): what
    ``digest_of`` hashes and vLLM loads, for every model kind the suite makes. STATE None:
    no weight file (a model vLLM serves with ``--load-format dummy``)."""
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    (dst / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "do_sample": False},
        indent=1, sort_keys=True))
    if state is not None:
        from safetensors.torch import save_file

        save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "sharedkv-tokenizer.json").write_text(
        json.dumps(_tokenizer_spec(words), indent=1, sort_keys=True))
    write_tokenizer(dst, words)


def make_copy_model(dst: Path, recipe: CopyModelRecipe | None = None) -> CopyModelCard:
    """Write the model to DST: config.json, model.safetensors, tokenizer files."""
    recipe = recipe or CopyModelRecipe()
    write_model_dir(dst, config_dict(recipe), weights(recipe), recipe)
    return CopyModelCard(dst, recipe, digest_of(dst))


def model_kind(path: Path) -> str | None:
    """The kind a generated model's config.json names ("copy", "geometry"), else None."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    section = config.get("sharedkv")
    return str(section.get("kind")) if isinstance(section, dict) else None


def is_copy_model(path: Path) -> bool:
    return model_kind(path) == KIND


def load_card(path: Path) -> CopyModelCard:
    config = json.loads((path / "config.json").read_text())
    fields = {k: v for k, v in config["sharedkv"].items()
              if k in CopyModelRecipe.__dataclass_fields__}
    return CopyModelCard(path, CopyModelRecipe(**fields), digest_of(path))
