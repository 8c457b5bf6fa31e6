"""The perf tier's payloads: seeded prompts, the same in every block and arm, each with its
SHA-256, so a pair of observations compares the same work.

Their answers do not matter here; their token counts do. For models in the copy model's
vocabulary (the copy model, the geometry model, the stub double) a prompt is seeded
random words, one token each, ``m * chunk + 1`` tokens long with ``<s>`` (as the service
corpus: a full hit leaves one token to recompute). For another checkpoint it is seeded
pseudo-text whose tokens its own tokenizer counts where one is at hand. Sessions are six
turns, each turn's prompt the previous one's plus a seeded reply-and-question, so a turn's
prefix is every earlier turn. Nothing is stored: the text is regenerated from its seed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_sharedkv.corpus.copy_corpus import chunks_for
from pytest_sharedkv.perf.observations import size_tokens

SEED = "sharedkv-perf"
WORDS, TEXT = "words", "text"
TURNS = 6
TURN_TOKENS = 256  # what each later turn adds: a reply and the next question


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Payload:
    id: str  # stable across blocks and runs
    size: str
    text: str = field(repr=False)
    sha256: str
    prompt_tokens: int | None  # with <s>, where the generator knows it


@dataclass(frozen=True)
class SessionPayload:
    id: str
    turns: tuple[Payload, ...]

    @property
    def sha256(self) -> str:
        return sha256("\n".join(t.sha256 for t in self.turns))


@dataclass
class PayloadSet:
    kind: str  # WORDS | TEXT
    requests: list[Payload]
    warmups: list[Payload]
    sessions: list[SessionPayload]
    source: str

    def sizes(self) -> list[str]:
        return list(dict.fromkeys(p.size for p in self.requests))

    def of_size(self, size: str) -> list[Payload]:
        return [p for p in self.requests if p.size == size]

    @property
    def digest(self) -> str:
        """sha256 over every payload's digest, in order (16 hex): the corpus digest."""
        parts = [p.sha256 for p in (*self.warmups, *self.requests)]
        parts += [s.sha256 for s in self.sessions]
        return sha256("\n".join(parts))[:16]


Generator = Callable[[str, int], tuple[str, int | None]]  # (seed, tokens) -> text, count


def word_generator(chunk: int) -> Generator:
    """Seeded copy-vocabulary words: exactly TOKENS tokens with <s>."""
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, text_of, word_ids

    recipe = CopyModelRecipe()
    words = list(word_ids(recipe))

    def make(seed: str, tokens: int) -> tuple[str, int | None]:
        rng = random.Random(seed)
        return text_of([rng.choice(words) for _ in range(tokens - 1)], recipe), tokens

    return make


def text_generator(model: Path | None) -> Generator:
    """Seeded pseudo-text of about TOKENS tokens, counted by the model's tokenizer where
    one is at hand (else None: the served usage says)."""
    from pytest_sharedkv.corpus.text_corpus import token_counter
    from pytest_sharedkv.models.tiny_model import synthetic_sentences

    count, exact = token_counter(model)

    def make(seed: str, tokens: int) -> tuple[str, int | None]:
        rng = random.Random(seed)
        parts: list[str] = []
        used = 0
        for sentence in synthetic_sentences(rng.randrange(1 << 30), 40 + tokens // 6):
            cost = count(sentence)
            if used + cost > tokens:
                break
            parts.append(sentence)
            used += cost
        text = " ".join(parts)
        return text, count(text) if exact else None

    return make


def _tokens(size: str, chunk: int, limit: int) -> int:
    nominal = size_tokens(size)
    if nominal is None:
        raise ValueError(f"perf size {size!r} is not a token count like 8k")
    chunks = chunks_for(nominal, chunk)
    while chunks > 2 and chunks * chunk + 1 > limit:
        chunks -= 1
    return chunks * chunk + 1


def build(kind: str, sizes: Sequence[str], chunk: int, generate: Generator,
          requests_per_size: int = 3, warmups: int = 2, sessions: int = 8,
          limit: int = 1 << 30, seed: str = SEED) -> PayloadSet:
    """Every payload of a screening, deterministic from SEED. LIMIT caps a prompt's tokens
    (the served context less the answer)."""

    def one(pid: str, size: str, tokens: int) -> Payload:
        text, count = generate(f"{seed}/{pid}", tokens)
        return Payload(pid, size, text, sha256(text), count)

    requests = [one(f"{size}-{i:02d}", size, _tokens(size, chunk, limit))
                for size in sizes for i in range(requests_per_size)]
    first = sizes[0]
    warm = [one(f"warm-{i:02d}", first, _tokens(first, chunk, limit)) for i in range(warmups)]
    base = _tokens(first, chunk, limit - TURNS * TURN_TOKENS)
    session_list = []
    for s in range(sessions):
        sid = f"session-{s:02d}"
        text, count = generate(f"{seed}/{sid}/base", base)
        turns = []
        for t in range(TURNS):
            if t:
                more, extra = generate(f"{seed}/{sid}/turn-{t}", TURN_TOKENS + 1)
                text = f"{text} {more}"
                count = (count + extra - 1) if count is not None and extra is not None \
                    else None
            turns.append(Payload(f"{sid}/turn-{t}", first, text, sha256(text),
                                 count if kind == WORDS else None))
        session_list.append(SessionPayload(sid, tuple(turns)))
    source = (f"seeded copy-vocabulary words ({seed}; chunk {chunk})" if kind == WORDS
              else f"seeded pseudo-text ({seed}); token counts from the served usage")
    return PayloadSet(kind, requests, warm, session_list, source)
