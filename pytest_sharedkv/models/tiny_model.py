"""A tiny hybrid (Gated DeltaNet + full attention) model, generated offline from a seed.

Qwen3-Next family, vLLM-servable: 3 linear-attention layers and 1 full-attention layer,
hidden 128, a 4-expert MoE (vLLM's Qwen3Next needs at least one MoE layer), seeded weights
and a byte-level BPE tokenizer trained locally on a seeded synthetic corpus. Nothing is
downloaded. The digest of config, weights and tokenizer names the model in every snapshot.
Needs transformers, tokenizers and safetensors (``pip install 'pytest-sharedkv[model]'``;
lmcache brings them too).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECIPE_VERSION = 1
RECIPE_FILE = "sharedkv-recipe.json"  # marks a directory as holding this kind
SPECIAL = ["<|endoftext|>", "<|pad|>"]


@dataclass(frozen=True)
class TinyModelRecipe:
    seed: int = 0
    vocab_size: int = 2048
    hidden_size: int = 128
    linear_layers: int = 3
    full_attention_layers: int = 1
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    linear_heads: tuple[int, int] = (2, 4)  # key heads, value heads
    linear_head_dim: int = 32
    num_experts: int = 4
    max_position_embeddings: int = 8192
    corpus_sentences: int = 4000

    def layer_types(self) -> list[str]:
        per_block = self.linear_layers // self.full_attention_layers
        types: list[str] = []
        for _ in range(self.full_attention_layers):
            types += ["linear_attention"] * per_block + ["full_attention"]
        return types

    def key(self) -> str:
        text = json.dumps({"v": RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ModelCard:
    path: Path
    config_sha256: str
    weights_sha256: str
    tokenizer_sha256: str

    @property
    def digest(self) -> str:
        joined = self.config_sha256 + self.weights_sha256 + self.tokenizer_sha256
        return hashlib.sha256(joined.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{self.path.name} (digest {self.digest})"


def synthetic_corpus(seed: int, sentences: int) -> list[str]:
    """Pseudo-words from a seeded syllable grammar: enough structure for BPE merges."""
    return list(synthetic_sentences(seed, sentences))


def synthetic_sentences(seed: int, sentences: int) -> Iterator[str]:
    """``synthetic_corpus``'s sentences one at a time, the same ones in the same order: a
    caller that stops at a token budget (the text and perf corpora, which ask for about
    2.5 times the sentences they use) does not generate the rest."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
             for _ in range(3000)]
    for _ in range(sentences):
        yield " ".join(rng.choice(words) for _ in range(rng.randint(6, 24))) + "."


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def card(path: Path) -> ModelCard:
    weights = sorted(path.glob("*.safetensors"))
    digest = hashlib.sha256(b"".join(_sha256(w).encode() for w in weights)).hexdigest()
    return ModelCard(path=path, config_sha256=_sha256(path / "config.json"),
                     weights_sha256=digest, tokenizer_sha256=_sha256(path / "tokenizer.json"))


def make_model(dst: Path, recipe: TinyModelRecipe | None = None) -> ModelCard:
    """Write the model to DST (config.json, model.safetensors, tokenizer files)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3NextConfig, Qwen3NextForCausalLM

    recipe = recipe or TinyModelRecipe()
    dst.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(synthetic_corpus(recipe.seed, recipe.corpus_sentences),
                                  trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=SPECIAL[0],
                                   pad_token=SPECIAL[1])
    fast.model_max_length = recipe.max_position_embeddings
    fast.save_pretrained(dst)
    key_heads, value_heads = recipe.linear_heads
    # older readers of Qwen3-Next configs look for the interval rather than layer_types
    legacy: dict[str, Any] = {
        "full_attention_interval": recipe.linear_layers // recipe.full_attention_layers + 1}
    config = Qwen3NextConfig(
        vocab_size=recipe.vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=2 * recipe.hidden_size,
        num_hidden_layers=recipe.linear_layers + recipe.full_attention_layers,
        layer_types=recipe.layer_types(),
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads, head_dim=recipe.head_dim,
        linear_num_key_heads=key_heads, linear_num_value_heads=value_heads,
        linear_key_head_dim=recipe.linear_head_dim, linear_value_head_dim=recipe.linear_head_dim,
        linear_conv_kernel_dim=4, num_experts=recipe.num_experts, num_experts_per_tok=2,
        moe_intermediate_size=recipe.hidden_size // 2,
        shared_expert_intermediate_size=recipe.hidden_size // 2, decoder_sparse_step=1,
        max_position_embeddings=recipe.max_position_embeddings, tie_word_embeddings=False,
        bos_token_id=fast.eos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        **legacy,
    )
    torch.manual_seed(recipe.seed)
    model: Any = Qwen3NextForCausalLM(config)
    model = model.to(dtype=torch.bfloat16).eval()
    model.save_pretrained(dst, safe_serialization=True)
    (dst / RECIPE_FILE).write_text(
        json.dumps({"recipe_version": RECIPE_VERSION, **asdict(recipe)}, indent=1))
    return card(dst)
