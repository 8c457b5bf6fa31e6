"""The service tier's corpus for the copy model: seeded documents whose answers are known
by construction, committed as a manifest of seeds, lengths, sources and SHA-256 digests.

A request is ``<s>`` + random words + an 8-word cue copied from a source; the expected
answer is the 16 words that followed the source. Its length is ``m * chunk + 1`` tokens,
so a full cache hit leaves exactly one token to recompute (the Gated DeltaNet state at the
hit boundary is then what the answer depends on). Each request copies from one chunk (the
16 keys it needs lie in it) and the sources are spread over every chunk position. Every
context the answer needs occurs exactly once before it (checked, and resampled if not), so
the symbolic copy rule and the model's weights agree on one answer.

Sessions: six turns on one document, alternating replicas; each turn appends filler and a
new cue for a source no earlier turn used, and the history carries earlier answers but
never this turn's, so every exact answer independently proves distant-prefix recovery.

The text of each payload is regenerated from its seed at run time and must hash to the
committed SHA-256: a generator that drifted is an error, not a silent new corpus.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_sharedkv.models.copy_model import MISS, CopyModelRecipe, text_of, vocabulary
from pytest_sharedkv.models.copy_rule import CONTEXT, continue_ids

GENERATOR_VERSION = 1
SCHEMA = "pytest-sharedkv/corpus/1"
CUE = 8
ANSWER = 16
SEED = "sharedkv-service"
# (size label, nominal tokens, measured requests, warm-ups): 264 measured requests; at ~1
# in 9 requests (the lazy allocator's rate on an H200) 264 miss the fault with p ~ 1e-13.
PLAN: tuple[tuple[str, int, int, int], ...] = (
    ("3k", 3_000, 200, 4), ("8k", 8_000, 40, 1), ("32k", 32_000, 16, 1),
    ("128k", 128_000, 8, 1))
SESSIONS = 8
TURNS = 6
SESSION_TOKENS = 3_000
CONTROLS = 8  # the sensitivity gate's requests (3k): half copy from the chunk it zeroes
PROTOCOL = 4  # documents the protocol checks send (3k)


class CorpusError(RuntimeError):
    """The generator cannot meet a constraint, or a payload does not hash as committed."""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def chunks_for(nominal: int, chunk: int, *, within: bool = False) -> int:
    """How many CHUNK-token chunks a NOMINAL-token document of the plan spans, at least 2 (a
    source chunk and one after it). The copy corpus builds its documents to whole chunks
    (``m * chunk + 1`` tokens), so it takes the nearest count; WITHIN: the document stays
    NOMINAL tokens long (the text corpus), so only the chunks that fit inside it count."""
    return max(2, nominal // chunk if within else round(nominal / chunk))


@dataclass(frozen=True)
class Request:
    """One payload and the answer it must get (word ids; the tokenizer adds ``<s>``)."""

    id: str
    size: str
    seed: str
    prompt_tokens: int  # with <s>
    source_chunk: int
    source: int  # position (with <s>) of the first key the answer copies from
    expected: tuple[int, ...]
    sha256: str
    role: str = "measured"  # measured | warmup | control | protocol

    def key(self) -> dict[str, str]:
        return {"size": self.size, "role": self.role}


@dataclass(frozen=True)
class Turn:
    index: int
    replica: str
    prompt_tokens: int
    source_chunk: int
    source: int
    expected: tuple[int, ...]
    sha256: str


@dataclass(frozen=True)
class Session:
    id: str
    seed: str
    turns: tuple[Turn, ...]


@dataclass
class Corpus:
    chunk: int
    recipe: CopyModelRecipe
    requests: list[Request] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    generated: dict[str, list[int]] = field(default_factory=dict, repr=False)  # id -> words

    def measured(self) -> list[Request]:
        return [r for r in self.requests if r.role == "measured"]

    def by_role(self, role: str) -> list[Request]:
        return [r for r in self.requests if r.role == role]

    def words(self, request: Request) -> list[int]:
        """The payload's word ids (regenerated from the seed and checked once)."""
        if request.id not in self.generated:
            words, _, _ = _document(request.seed, request.prompt_tokens, self.chunk,
                                    request.source_chunk, self.recipe)
            if sha256(text_of(words, self.recipe)) != request.sha256:
                raise CorpusError(f"request {request.id}: the payload regenerated from seed "
                                  f"{request.seed!r} does not hash to the committed "
                                  f"{request.sha256[:16]}: the generator changed")
            self.generated[request.id] = words
        return self.generated[request.id]

    def text(self, request: Request) -> str:
        return text_of(self.words(request), self.recipe)

    def session_prompts(self, session: Session) -> Iterator[tuple[Turn, str]]:
        """Each turn with its prompt text (regenerated and checked against its digest)."""
        for turn, (words, _) in zip(session.turns, _session_words(
                session.seed, self.chunk, self.recipe), strict=True):
            text = text_of(words, self.recipe)
            if sha256(text) != turn.sha256:
                raise CorpusError(f"session {session.id} turn {turn.index}: the regenerated "
                                  "payload does not hash to the committed digest")
            yield turn, text

    def to_data(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "generator_version": GENERATOR_VERSION, "chunk": self.chunk,
                "recipe_key": self.recipe.key(), "cue": CUE, "answer": ANSWER,
                "context": CONTEXT,
                "requests": [asdict(r) for r in self.requests],
                "sessions": [asdict(s) for s in self.sessions]}

    @classmethod
    def from_data(cls, data: dict[str, Any], recipe: CopyModelRecipe) -> Corpus:
        if data.get("schema") != SCHEMA:
            raise CorpusError(f"corpus schema {data.get('schema')!r}, expected {SCHEMA!r}")
        if data.get("recipe_key") != recipe.key():
            raise CorpusError("the corpus was made for another copy-model recipe "
                              f"({data.get('recipe_key')}, this model {recipe.key()})")
        requests = [Request(**{**r, "expected": tuple(r["expected"])})
                    for r in data["requests"]]
        sessions = [Session(s["id"], s["seed"], tuple(
            Turn(**{**t, "expected": tuple(t["expected"])}) for t in s["turns"]))
            for s in data["sessions"]]
        return cls(int(data["chunk"]), recipe, requests, sessions)


def _miss_id(recipe: CopyModelRecipe) -> int:
    return vocabulary(recipe).index("\u2581" + MISS)


def _unique_answer(ids: Sequence[int], source: int, recipe: CopyModelRecipe) -> bool:
    """The 16 contexts the answer needs occur exactly twice in prompt + answer (at the
    source and as the query), and the copy rule gives the expected answer."""
    expected = list(ids[source:source + ANSWER])
    full = list(ids) + expected
    grams = Counter(zip(*(full[k:] for k in range(CONTEXT)), strict=False))  # every window
    for k in range(ANSWER):
        if grams[tuple(full[source + k - CONTEXT:source + k])] != 2:
            return False
    return continue_ids(ids, ANSWER, _miss_id(recipe)) == expected


def _document(seed: str, prompt_tokens: int, chunk: int, source_chunk: int,
              recipe: CopyModelRecipe, attempts: int = 50) -> tuple[list[int], int, int]:
    """(word ids after <s>, source position, attempt) for one request."""
    from pytest_sharedkv.models.copy_model import word_ids

    words = list(word_ids(recipe))
    body_len = prompt_tokens - 1 - CUE
    lo = max(source_chunk * chunk, CUE + 1)
    hi = min((source_chunk + 1) * chunk, body_len + 1) - ANSWER
    if hi < lo:
        raise CorpusError(f"chunk {source_chunk} of a {prompt_tokens}-token prompt cannot "
                          f"hold the {ANSWER} keys of an answer")
    for attempt in range(attempts):
        rng = random.Random(f"{seed}/{attempt}")
        body = [rng.choice(words) for _ in range(body_len)]
        source = lo + rng.randrange(hi - lo + 1)  # absolute position of the first key
        cue = body[source - 1 - CUE:source - 1]  # positions shift by one for <s>
        ids = [0, *body, *cue]
        if _unique_answer(ids, source, recipe):
            return body + cue, source, attempt
    raise CorpusError(f"{seed}: no unique answer in {attempts} attempts")


def make_request(rid: str, size: str, seed: str, prompt_tokens: int, chunk: int,
                 source_chunk: int, recipe: CopyModelRecipe, role: str = "measured"
                 ) -> tuple[Request, list[int]]:
    words, source, _ = _document(seed, prompt_tokens, chunk, source_chunk, recipe)
    expected = tuple([0, *words][source:source + ANSWER])
    return Request(rid, size, seed, prompt_tokens, source_chunk, source, expected,
                   sha256(text_of(words, recipe)), role), words


def control_chunks(chunks: int) -> list[int]:
    """Source chunks of the sensitivity gate's controls in a CHUNKS-chunk document: the
    even ones copy from the chunk the gate zeroes (the middle one), the odd ones from
    others, which must stay exact."""
    zeroed = chunks // 2
    return [zeroed if i % 2 == 0 else (zeroed + 1 + i) % (chunks - 1) for i in range(CONTROLS)]


def spread(count: int, chunks: int, offset: int = 0) -> list[int]:
    """Source chunks for COUNT requests over CHUNKS chunk positions: every position when
    there are enough requests, else evenly from the first chunk to the last."""
    if count >= chunks:
        return [(i + offset) % chunks for i in range(count)]
    return [round(i * (chunks - 1) / max(count - 1, 1)) for i in range(count)]


def _session_words(seed: str, chunk: int, recipe: CopyModelRecipe
                   ) -> list[tuple[list[int], int]]:
    """(word ids, source position) of each turn's prompt: turn t extends turn t-1's prompt
    and expected answer with filler and a cue for a source in a chunk no turn used."""
    from pytest_sharedkv.models.copy_model import word_ids

    words = list(word_ids(recipe))
    m = chunks_for(SESSION_TOKENS, chunk)
    if m - 1 < TURNS:
        raise CorpusError(f"a {m}-chunk session document cannot hold {TURNS} sources")
    for attempt in range(50):
        rng = random.Random(f"{seed}/{attempt}")
        base = [rng.choice(words) for _ in range(m * chunk - CUE)]
        pool = list(range(m - 1))  # distinct source chunks, none the last
        for i in range(TURNS):
            j = i + rng.randrange(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        history = [0, *base]
        turns: list[tuple[list[int], int]] = []
        for c in pool[:TURNS]:
            lo, hi = max(c * chunk, CUE + 1), (c + 1) * chunk - ANSWER
            source = lo + rng.randrange(hi - lo + 1)
            filler = [rng.choice(words) for _ in range(24 + rng.randrange(73))]
            ids = [*history, *filler, *history[source - CUE:source]]
            if not _unique_answer(ids, source, recipe):
                break
            turns.append((ids[1:], source))
            history = [*ids, *history[source:source + ANSWER]]  # the expected answer
        if len(turns) == TURNS:
            return turns
    raise CorpusError(f"session {seed}: no unique answers in 50 attempts")


def make_session(sid: str, seed: str, chunk: int, recipe: CopyModelRecipe) -> Session:
    turns = []
    for t, (words, source) in enumerate(_session_words(seed, chunk, recipe)):
        ids = [0, *words]
        turns.append(Turn(t, "A" if t % 2 == 0 else "B", len(ids), source // chunk, source,
                          tuple(ids[source:source + ANSWER]), sha256(text_of(words, recipe))))
    return Session(sid, seed, tuple(turns))


def build(chunk: int, recipe: CopyModelRecipe | None = None, seed: str = SEED,
          plan: Sequence[tuple[str, int, int, int]] = PLAN, sessions: int = SESSIONS
          ) -> Corpus:
    """The whole corpus, deterministic from SEED (minutes for the 128k documents)."""
    recipe = recipe or CopyModelRecipe()
    corpus = Corpus(chunk, recipe)

    def add(rid: str, size: str, tokens: int, source_chunk: int, role: str) -> None:
        request, words = make_request(rid, size, f"{seed}/{rid}", tokens, chunk, source_chunk,
                                      recipe, role)
        corpus.requests.append(request)
        corpus.generated[rid] = words

    for size, nominal, count, warmups in plan:
        m = chunks_for(nominal, chunk)
        tokens = m * chunk + 1
        for i, c in enumerate(spread(warmups, m, offset=m // 2)):
            add(f"warm-{size}-{i:02d}", size, tokens, c, "warmup")
        for i, c in enumerate(spread(count, m)):
            add(f"{size}-{i:03d}", size, tokens, c, "measured")
    m = chunks_for(PLAN[0][1], chunk)
    for i, c in enumerate(control_chunks(m)):
        add(f"control-{i:02d}", PLAN[0][0], m * chunk + 1, c, "control")
    for i, c in enumerate(spread(PROTOCOL, m)):
        add(f"protocol-{i:02d}", PLAN[0][0], m * chunk + 1, c, "protocol")
    for i in range(sessions):
        sid = f"session-{i:02d}"
        corpus.sessions.append(make_session(sid, f"{seed}/{sid}", chunk, recipe))
    return corpus


def zeroed_chunk(corpus: Corpus) -> int:
    """The chunk the sensitivity gate zeroes: the one the even control requests copy from."""
    return corpus.by_role("control")[0].source_chunk


def load(path: Path, recipe: CopyModelRecipe) -> Corpus:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{path}: cannot read the corpus manifest ({exc})") from None
    return Corpus.from_data(data, recipe)


def write(corpus: Corpus, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(corpus.to_data(), indent=None, separators=(",", ":"),
                               sort_keys=True) + "\n")
