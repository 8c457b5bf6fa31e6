"""The service tier's corpus for a user's own model: text with planted codewords.

A real checkpoint does not copy by construction, so its answers have no reference known in
advance. Each document is seeded pseudo-text with one planted fact ("Record 17: its code
word is ZARVOK-4821.") in a chosen chunk and, at the end, a question asking it back (the
style of LMCache's own faithfulness check). The reference is replica A's cold answer,
token for token; whether the answer contains the codeword says whether the model used the
planted fact at all (a model that ignores its context makes every check weak, and the
sensitivity gate says so). Token counts come from the model's own tokenizer when it is at
hand, else from a words-to-tokens estimate, and are reported as measured.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path

from pytest_sharedkv.corpus.cases import Case, CaseSet
from pytest_sharedkv.corpus.copy_corpus import PLAN, PROTOCOL, chunks_for, control_chunks, spread
from pytest_sharedkv.models.tiny_model import synthetic_sentences

ANSWER_TOKENS = 16
TOKENS_PER_WORD = 1.4  # estimate when no tokenizer is at hand
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def token_counter(model: Path | None) -> tuple[Callable[[str], int], bool]:
    """(count(text) with special tokens, exact?)."""
    if model is not None and (model / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        return (lambda text: len(tokenizer.encode(text).ids)), True
    return (lambda text: round(len(text.split()) * TOKENS_PER_WORD)), False


def _codeword(rng: random.Random) -> str:
    word = "".join(rng.choice(SYLLABLES) for _ in range(3)).upper()
    return f"{word}-{rng.randrange(1000, 10000)}"


def text_case(cid: str, role: str, size: str, tokens: int, source_chunk: int, chunk: int,
              seed: str, count: Callable[[str], int], exact: bool = True) -> Case:
    """A document of about TOKENS tokens with its fact planted in SOURCE_CHUNK."""
    rng = random.Random(seed)
    record = rng.randrange(10, 100)
    code = _codeword(rng)
    fact = f"Record {record}: its code word is {code}."
    question = (f"\nQuestion: what is the code word of record {record}? Answer: the code word "
                "of record")
    budget = tokens - count(question) - count(fact) - 2
    parts, used, planted = [], 0, False
    for sentence in synthetic_sentences(rng.randrange(1 << 30), 40 + tokens // 8):
        if not planted and used >= source_chunk * chunk + 1:
            parts.append(fact)
            planted = True
        cost = count(sentence)  # counted once each: summing them is close enough to place
        if used + cost > budget:  # the fact; the whole prompt is counted exactly below
            break
        parts.append(sentence)
        used += cost
    if not planted:
        parts.append(fact)
    text = " ".join(parts)
    prompt = text + question
    return Case(cid, role, size, prompt, hashlib.sha256(prompt.encode()).hexdigest(),
                count(prompt) if exact else None, None, source_chunk, code)


def build_text(model: Path | None, chunk: int, max_tokens: int, seed: str = "sharedkv-text",
               sizes: tuple[str, ...] | None = None) -> CaseSet:
    count, exact = token_counter(model)
    cases: list[Case] = []
    skipped: list[str] = []
    for size, nominal, measured, warmups in PLAN:
        if sizes is not None and size not in sizes:
            continue
        if nominal + ANSWER_TOKENS > max_tokens:
            skipped.append(size)
            continue
        m = chunks_for(nominal, chunk, within=True)
        for i, c in enumerate(spread(warmups, m)):
            cases.append(text_case(f"warm-text-{size}-{i:02d}", "warmup", size, nominal, c,
                                   chunk, f"{seed}/warm/{size}/{i}", count, exact))
        for i, c in enumerate(spread(measured, m)):
            cases.append(text_case(case_id("text", size, i), "measured", size, nominal, c,
                                   chunk, f"{seed}/{size}/{i}", count, exact))
    first = PLAN[0]
    m = chunks_for(first[1], chunk, within=True)
    chunks = control_chunks(m)
    for i, c in enumerate(chunks):
        cases.append(text_case(f"control-text-{i:02d}", "control", first[0], first[1], c,
                               chunk, f"{seed}/control/{i}", count, exact))
    for i, c in enumerate(spread(PROTOCOL, m)):
        cases.append(text_case(f"protocol-text-{i:02d}", "protocol", first[0], first[1], c,
                               chunk, f"{seed}/protocol/{i}", count, exact))
    source = ("text corpus with planted codewords; token counts from the model's tokenizer"
              if exact else "text corpus with planted codewords; token counts ESTIMATED "
              "(no tokenizer.json)")
    if skipped:
        source += f"; sizes {', '.join(skipped)} skipped (longer than the model's context)"
    return CaseSet("text", chunk, cases, [], decode=None, zeroed_chunk=chunks[0],
                   answer_tokens=ANSWER_TOKENS, source=source)


def case_id(kind: str, size: str, index: int) -> str:
    return f"{size}-{index:03d}" if kind == "copy" else f"text-{size}-{index:03d}"
