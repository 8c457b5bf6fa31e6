"""The copy model's answer, computed symbolically (no weights): what the model must say.

The model continues a prompt by finding the one earlier position whose preceding
``CONTEXT`` tokens equal the last ``CONTEXT`` tokens, and copying the token there; with no
such position (or more than one disagreeing), it says ``<miss>``. The corpus generator
uses this to prove each expected continuation unique by construction, and the stub double
answers with it, so the machinery is tested on CPU against the same rule the GPU model
implements in its weights.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Sequence

CONTEXT = 5


def continue_ids(ids: Sequence[int], steps: int, miss: int,
                 hidden: Container[int] = ()) -> list[int]:
    """Greedy continuation of ``ids`` (``<s>`` first) for ``steps`` tokens.

    ``hidden``: positions whose KV the model cannot see (a lost chunk): the key there
    (which holds the context before it) matches nothing, so nothing is copied from there.
    Two matches that disagree never occur in the corpus (its generator excludes them);
    the rule calls them a miss.
    """
    seq = list(ids)
    # the key at position j is seq[j - CONTEXT:j] and what is copied from there is seq[j]:
    # every gram with the token after it, built in C (the corpus generator calls this on
    # ~3M tokens); a gram seen more than once keeps the set of its tokens
    keys = list(zip(*(seq[k:len(seq) - 1] for k in range(CONTEXT)), strict=False))
    tokens = seq[CONTEXT:]
    if hidden:
        kept = [i for i in range(len(keys)) if i + CONTEXT not in hidden]
        keys, tokens = [keys[i] for i in kept], [tokens[i] for i in kept]
    last: dict[tuple[int, ...], int] = dict(zip(keys, tokens, strict=True))
    counts = Counter(keys)
    many: dict[tuple[int, ...], set[int]] = {}
    for key, token in zip(keys, tokens, strict=True):
        if counts[key] > 1:
            many.setdefault(key, set()).add(token)

    def add(key: tuple[int, ...], token: int) -> None:
        counts[key] += 1
        if counts[key] > 1:
            many.setdefault(key, {last[key]}).add(token)
        last[key] = token

    out = []
    for _ in range(steps):
        context = tuple(seq[len(seq) - CONTEXT:])
        found = many.get(context) or ({last[context]} if context in last else set())
        token = next(iter(found)) if len(found) == 1 else miss
        grown = tuple(seq[len(seq) - CONTEXT:]) if len(seq) >= CONTEXT else None
        seq.append(token)
        out.append(token)
        if grown is not None:
            add(grown, token)
    return out


def first_divergence(expected: Sequence[object], observed: Sequence[object]) -> int | None:
    """Index of the first token where OBSERVED differs from EXPECTED (None: equal)."""
    for i, (a, b) in enumerate(zip(expected, observed, strict=False)):
        if a != b:
            return i
    if len(expected) != len(observed):
        return min(len(expected), len(observed))
    return None
