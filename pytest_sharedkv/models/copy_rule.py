"""The copy model's answer, computed symbolically (no weights): what the model must say.

The model continues a prompt by finding the one earlier position whose preceding
``CONTEXT`` tokens equal the last ``CONTEXT`` tokens, and copying the token there; with no
such position (or more than one disagreeing), it says ``<miss>``. The corpus generator
uses this to prove each expected continuation unique by construction, and the stub double
answers with it, so the machinery is tested on CPU against the same rule the GPU model
implements in its weights.
"""

from __future__ import annotations

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
    index: dict[tuple[int, ...], set[int]] = {}
    for j in range(CONTEXT, len(seq)):
        if j not in hidden:
            index.setdefault(tuple(seq[j - CONTEXT:j]), set()).add(j)
    out = []
    for _ in range(steps):
        t = len(seq) - 1
        context = tuple(seq[t - CONTEXT + 1:t + 1])
        found = {seq[j] for j in index.get(context, ()) if j <= t}
        token = found.pop() if len(found) == 1 else miss
        seq.append(token)
        out.append(token)
        j = len(seq) - 1
        index.setdefault(tuple(seq[j - CONTEXT:j]), set()).add(j)
    return out


def first_divergence(expected: Sequence[object], observed: Sequence[object]) -> int | None:
    """Index of the first token where OBSERVED differs from EXPECTED (None: equal)."""
    for i, (a, b) in enumerate(zip(expected, observed, strict=False)):
        if a != b:
            return i
    if len(expected) != len(observed):
        return min(len(expected), len(observed))
    return None
