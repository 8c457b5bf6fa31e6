"""Prompts whose cross-replica hits end mid-prompt, the way production traffic's do
(issue 48 item 3): the copy model's rule and vocabulary, seeded, constructed, committed as
a manifest of seeds, boundaries and SHA-256 digests, as the copy corpus is.

Each family is two requests: replica A sends the first, cold; replica B then sends the
second, whose pool hit ends at ``boundary`` tokens (``<s>`` counted; LMCache hits whole
chunks). Kinds:

* ``system-prompt``: a long shared prefix (a system prompt), the two diverging after it in
  the middle of a chunk; B's hit ends at the last whole chunk of the prefix, inside A's
  prompt.
* ``few-shot``: the shared prefix is a run of examples (blocks of words repeated in both),
  the same boundary inside A's prompt.
* ``turn-inside``: B's turn keeps only part of A's (a history trimmed mid-turn, an edited
  message): the hit ends inside A's turn.
* ``turn-extends`` (the control): B's turn extends A's, whose prompt is whole chunks, so
  the hit ends exactly where A's prefill ended, where an engine that keeps a state at the
  end of a scheduler step kept one. ``kept`` is true for these alone.
* ``trimmed``: as ``turn-extends``, but the runner trims B's hit at ``trim_chunk`` (an L2
  that lost that chunk, or an eviction): the boundary falls inside A's prompt.

``kept``: whether A's engine ended a prefill there (its prompt's end) when it prefills a
prompt in one scheduler step; with steps ending at every chunk
(``--max-num-batched-tokens <chunk>``) every boundary is kept. Each B request copies from
a source at least ``FAR`` tokens from its boundary (before it in half the families, after
it in the others), so only a recurrent state carried across the boundary (the memory copy
model's) shows a wrong one in the answer.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.corpus.copy_corpus import ANSWER, CUE, CorpusError, _unique_answer
from pytest_sharedkv.models.copy_model import CopyModelRecipe, text_of, word_ids

SCHEMA = "pytest-sharedkv/boundary-corpus/1"
GENERATOR_VERSION = 1
SEED = "sharedkv-boundaries"
KINDS = ("system-prompt", "few-shot", "turn-inside", "turn-extends", "trimmed")
FAMILIES_PER_KIND = 4
DOCUMENT_CHUNKS = 16  # A's prompt, about
FAR = 24
MANIFEST = "boundary-corpus-c{chunk}.json"


@dataclass(frozen=True)
class BoundaryRequest:
    id: str
    family: str
    kind: str
    replica: str  # A (first, cold) or B (second, hits A's chunks)
    prompt_tokens: int  # with <s>
    boundary: int  # tokens B's hit covers (0 for A)
    kept: bool  # A's prefill ended there (see the module's docstring)
    trim_chunk: int | None  # the runner trims B's hit before this chunk
    source: int
    expected: tuple[int, ...]
    sha256: str


def _sha(words: list[int], recipe: CopyModelRecipe) -> str:
    return hashlib.sha256(text_of(words, recipe).encode()).hexdigest()


def _with_cue(rng: random.Random, ids: list[int], lo: int, hi: int,
              recipe: CopyModelRecipe) -> tuple[list[int], int] | None:
    """IDS (with <s>) plus a cue copied from a source in [LO, HI], if its answer is unique."""
    if hi < lo:
        return None
    source = lo + rng.randrange(hi - lo + 1)
    full = [*ids, *ids[source - CUE:source]]
    return (full, source) if _unique_answer(full, source, recipe) else None


def _family(kind: str, index: int, chunk: int, seed: str, recipe: CopyModelRecipe
            ) -> tuple[list[int], list[int], int, int | None, int]:
    """(A's ids, B's ids, B's boundary, trim chunk, B's source), with <s>."""
    words = list(word_ids(recipe))
    before = index % 2 == 0  # the source lies before the boundary, else after it
    for attempt in range(50):
        rng = random.Random(f"{seed}/{kind}/{index}/{attempt}")

        def draw(n: int, rng: random.Random = rng) -> list[int]:
            return [rng.choice(words) for _ in range(n)]

        trim = None
        if kind in ("system-prompt", "few-shot"):
            if kind == "system-prompt":
                prefix = draw(10 * chunk + chunk // 2)
            else:
                shots = [draw(2 * chunk + 5) for _ in range(4)]
                prefix = [w for shot in shots for w in shot]
            a_body = [0, *prefix, *draw(5 * chunk)]
            b_body = [0, *prefix, *draw(5 * chunk)]
            while b_body[len(prefix) + 1] == a_body[len(prefix) + 1]:
                b_body[len(prefix) + 1] = rng.choice(words)
            boundary = (len(prefix) + 1) // chunk * chunk
        elif kind == "turn-inside":
            a_body = [0, *draw(DOCUMENT_CHUNKS * chunk - 1)]
            cut = 11 * chunk + chunk // 2
            b_body = [*a_body[:cut], *draw(4 * chunk)]
            while b_body[cut] == a_body[cut]:
                b_body[cut] = rng.choice(words)
            boundary = cut // chunk * chunk
        else:  # turn-extends, trimmed: A's whole prompt (cue included) whole chunks
            a_body = [0, *draw(DOCUMENT_CHUNKS * chunk - 1 - CUE)]
            boundary = len(a_body) + CUE
            if kind == "trimmed":
                trim = 9
                boundary = trim * chunk
        # A: its own cue (it is cold)
        a = _with_cue(rng, a_body, CUE + 1, len(a_body) - ANSWER, recipe)
        if a is None:
            continue
        if kind in ("turn-extends", "trimmed"):
            b_body = [*a[0], *draw(4 * chunk)]  # B's turn extends A's whole prompt
        lo, hi = ((CUE + 6, boundary - FAR - ANSWER) if before
                  else (boundary + FAR + 5, len(b_body) - ANSWER))
        b = _with_cue(rng, b_body, lo, hi, recipe)
        if b is None:
            continue
        return a[0], b[0], boundary, trim, b[1]
    raise CorpusError(f"{kind} family {index}: no unique answers in 50 attempts")


def build(chunk: int, recipe: CopyModelRecipe | None = None, seed: str = SEED
          ) -> list[BoundaryRequest]:
    recipe = recipe or CopyModelRecipe()
    out = []
    for kind in KINDS:
        for index in range(FAMILIES_PER_KIND):
            family = f"{kind}-{index:02d}"
            a, b, boundary, trim, source = _family(kind, index, chunk, seed, recipe)
            a_source = _source_of(a)
            out.append(BoundaryRequest(
                f"{family}/A", family, kind, "A", len(a), 0, False, None, a_source,
                tuple(a[a_source:a_source + ANSWER]), _sha(a[1:], recipe)))
            out.append(BoundaryRequest(
                f"{family}/B", family, kind, "B", len(b), boundary,
                kind == "turn-extends", trim, source, tuple(b[source:source + ANSWER]),
                _sha(b[1:], recipe)))
    return out


def _source_of(ids: list[int]) -> int:
    """The source a prompt's cue (its last CUE words) copies from: where they occur first."""
    cue = ids[-CUE:]
    for start in range(1, len(ids) - CUE):
        if ids[start:start + CUE] == cue:
            return start + CUE
    raise CorpusError("a cue that occurs nowhere before it")


def words_of(request: BoundaryRequest, chunk: int, recipe: CopyModelRecipe | None = None,
             seed: str = SEED) -> list[int]:
    """The request's word ids (no <s>), regenerated and checked against its digest."""
    recipe = recipe or CopyModelRecipe()
    kind, index = request.kind, int(request.family.rsplit("-", 1)[1])
    a, b, _, _, _ = _family(kind, index, chunk, seed, recipe)
    words = (a if request.replica == "A" else b)[1:]
    if _sha(words, recipe) != request.sha256:
        raise CorpusError(f"{request.id}: the regenerated payload does not hash to the "
                          "committed digest: the generator changed")
    return words


def to_data(requests: list[BoundaryRequest], chunk: int, recipe: CopyModelRecipe
            ) -> dict[str, Any]:
    return {"schema": SCHEMA, "generator_version": GENERATOR_VERSION, "chunk": chunk,
            "recipe_key": recipe.key(), "seed": SEED, "far": FAR,
            "requests": [asdict(r) for r in requests]}


def load(path: Path, recipe: CopyModelRecipe | None = None) -> list[BoundaryRequest]:
    recipe = recipe or CopyModelRecipe()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{path}: cannot read the boundary corpus ({exc})") from None
    if data.get("schema") != SCHEMA or data.get("recipe_key") != recipe.key():
        raise CorpusError(f"{path}: another schema or copy-model recipe")
    return [BoundaryRequest(**{**r, "expected": tuple(r["expected"])})
            for r in data["requests"]]


def write(requests: list[BoundaryRequest], chunk: int, path: Path,
          recipe: CopyModelRecipe | None = None) -> None:
    recipe = recipe or CopyModelRecipe()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_data(requests, chunk, recipe), indent=None,
                               separators=(",", ":"), sort_keys=True) + "\n")
