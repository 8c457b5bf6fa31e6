"""The memory copy model's corruption matrix on CPU (transformers): a wrong Gated DeltaNet
state resumed at a hit boundary far from the source changes the answer.

Each row resumes a prefill at a boundary ``b`` that lies at least ``FAR`` tokens from the
prompt's first word (the planted codeword), from the copied source and its answer's keys,
and from the prompt's end: the tokens before ``b`` are prefilled exactly (attention KV as
the pool holds it), every Gated DeltaNet layer's conv and recurrent state is then replaced
the way a replica resuming from a wrong state would see it, the rest of the prompt is
prefilled on top and the answer continued greedily.

Rows: the exact state (the control: a split prefill changes nothing); the state zeroed
(what a null block holds); another prompt's state at the same boundary (foreign); the
state of an earlier position of the same prompt before its first word was written
(stale, from the prompt's start); and the state one chunk earlier (stale, after the first
word), which this model's answers cannot show: its memory holds the same codeword there
(the state oracle judges those bytes, ``stack/state_oracle.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.models.copy_matrix import CopyRunner, batched, linear_layers

# row -> whether it must change the answer
EXPECTED_CHANGE: dict[str, bool] = {
    "resume-exact-far": False,
    "resume-zeroed-far": True,
    "resume-foreign-far": True,
    "resume-stale-from-start-far": True,
    "resume-stale-one-chunk-far": False,
}
FAR = 24


@dataclass(frozen=True)
class MemoryRow:
    corruption: str
    request: str
    boundary: int
    expected: tuple[int, ...]
    answer: tuple[int, ...]
    margin: float

    @property
    def changed(self) -> bool:
        return self.answer != self.expected

    @property
    def as_expected(self) -> bool:
        return self.changed == EXPECTED_CHANGE[self.corruption]


def far_boundaries(prompt: int, source: int, steps: int, chunk: int) -> list[int]:
    """Chunk boundaries at least FAR tokens from the first word (position 1), from the
    source's keys (SOURCE - 5 .. SOURCE + STEPS) and from the prompt's end (PROMPT tokens
    with ``<s>``)."""
    lo, hi = 1 + FAR, prompt - 1 - FAR
    return [b for b in range(chunk, prompt, chunk)
            if lo <= b <= hi and (b <= source - 5 - FAR or b >= source + steps + FAR)]


def common_boundary(requests: Sequence[tuple[str, list[int], int]], steps: int,
                    chunk: int) -> int:
    """One far boundary for every request (so each one's foreign state is another's at the
    same position): the middle of those they all allow."""
    shared: set[int] | None = None
    for _, ids, source in requests:
        allowed = set(far_boundaries(len(ids), source, steps, chunk))
        shared = allowed if shared is None else shared & allowed
    if not shared:
        raise ValueError(f"no chunk boundary lies {FAR} tokens from the first word, every "
                         "source and the end of these prompts")
    ordered = sorted(shared)
    return ordered[len(ordered) // 2]


def _states(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.conv_states[0].clone(), layer.recurrent_states[0].clone())
            for layer in linear_layers(cache)]


def _set_states(cache: Any, states: Sequence[tuple[Any, Any]] | None) -> None:
    for n, layer in enumerate(linear_layers(cache)):
        if states is None:
            layer.conv_states[0].zero_()
            layer.recurrent_states[0].zero_()
        else:
            layer.conv_states[0].copy_(states[n][0])
            layer.recurrent_states[0].copy_(states[n][1])


def run_memory_matrix(model_dir: Path, requests: Sequence[tuple[str, list[int], int]],
                      chunk: int, steps: int = 8, dtype: str = "bfloat16") -> list[MemoryRow]:
    """REQUESTS: (id, ids with <s>, source position), at least two, all the same length."""
    from transformers import DynamicCache

    runner = CopyRunner(model_dir, dtype)
    torch = runner.torch
    b = common_boundary(requests, steps, chunk)
    prefixes: list[Any] = []
    earlier: list[Any] = []
    start: list[Any] = []
    with torch.no_grad():
        for _, ids, _ in requests:  # one prefill to b, the states at 1 and b - chunk kept
            cache = DynamicCache(config=runner.model.config)
            for n, part in enumerate((ids[:1], ids[1:b - chunk], ids[b - chunk:b])):
                runner.model(input_ids=torch.tensor([part]), use_cache=True,
                             **{runner.cache_kw: cache})
                (start if n == 0 else earlier if n == 1 else prefixes).append(
                    cache if n == 2 else _states(cache))
    rows: list[MemoryRow] = []
    for n, (rid, ids, source) in enumerate(requests):
        expected = tuple(ids[source:source + steps])
        wanted = {
            "resume-exact-far": _states(prefixes[n]),
            "resume-zeroed-far": None,
            "resume-foreign-far": _states(prefixes[(n + 1) % len(requests)]),
            "resume-stale-from-start-far": start[n],
            "resume-stale-one-chunk-far": earlier[n],
        }
        caches = []
        for states in wanted.values():
            cache = copy.deepcopy(prefixes[n])
            _set_states(cache, states)
            caches.append(cache)
        merged = batched(caches)
        with torch.no_grad():
            runner.model(input_ids=torch.tensor([ids[b:-1]] * len(caches)), use_cache=True,
                         **{runner.cache_kw: merged})
        resumed = runner.continue_batch(merged, [ids[-1]] * len(caches), steps)
        for name, (answer, margin) in zip(wanted, resumed, strict=True):
            rows.append(MemoryRow(name, rid, b, expected, tuple(answer), margin))
    return rows


def table(rows: Sequence[MemoryRow]) -> list[str]:
    """Markdown: row -> changed answers / requests, expected, min margin."""
    from pytest_sharedkv.report.markdown import markdown_table

    body = []
    for name in dict.fromkeys(r.corruption for r in rows):
        group = [r for r in rows if r.corruption == name]
        body.append([name, f"{sum(r.changed for r in group)}/{len(group)}",
                     "changed" if EXPECTED_CHANGE[name] else "unchanged",
                     "yes" if all(r.as_expected for r in group) else "NO",
                     f"{min(r.margin for r in group):.1f}"])
    return markdown_table(["state resumed at a far boundary", "answers changed", "must be",
                           "as expected", "min margin (nats)"], body)
