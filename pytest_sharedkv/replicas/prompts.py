"""Long, exact-answer prompts for replica pairs: seeded, offline, sized in the model's own
tokens when its tokenizer is at hand (3 prompts of about 3,000 tokens by default)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_sharedkv.replicas.tiny_model import synthetic_corpus

TOKENS_PER_WORD = 2.5  # the tiny model's tokenizer on the synthetic corpus


def token_counter(model: Path | None) -> Callable[[str], float]:
    if model is not None and (model / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        return lambda text: len(tokenizer.encode(text).ids)
    return lambda text: len(text.split()) * TOKENS_PER_WORD


def long_prompts(count: int = 3, target_tokens: int = 3000, model: Path | None = None,
                 seed: int = 101) -> list[str]:
    count_tokens = token_counter(model)
    prompts = []
    for index in range(count):
        text = ""
        for sentence in synthetic_corpus(seed + index, 2000):
            candidate = f"{text} {sentence}".strip()
            if count_tokens(candidate) > target_tokens:
                break
            text = candidate
        prompts.append(text)
    return prompts
