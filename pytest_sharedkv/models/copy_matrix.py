"""The copy model's corruption matrix, on CPU with transformers: what it sees and what not.

Each request's prompt is split where a full cache hit would split it (all but the last
token cached, as vLLM recomputes one token); the cache is corrupted the way a faulty
transfer would, then the last token and the greedy continuation are computed on top.
Expected: clean = the answer by construction; 1-ulp noise on every cached value =
unchanged; the source chunk lost, or holding another prompt's KV = changed; another chunk
lost = unchanged; chunks permuted within the prompt = unchanged (attention sees content,
not order: a documented limit for any model); Gated DeltaNet state zeroed, stale (the
previous chunk's) or partly so = changed; Gated DeltaNet state reset mid-prompt, at a hit
boundary b with all attention KV before b exact (what B resumes from when the pool's
chunk before b holds a state no engine kept) = changed when the source lies 3 tokens
after b, unchanged when it lies far from b (the answer reads keys only within ~5 tokens
after a reset).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# corruption -> whether it must change the answer
EXPECTED_CHANGE: dict[str, bool] = {
    "clean": False,
    "noise-1ulp": False,
    "lost-other-chunk": False,
    "permuted-chunks": False,
    "lost-source-chunk": True,
    "foreign-source-chunk": True,
    "state-zeroed": True,
    "state-stale": True,
    "conv-state-zeroed": True,
    "recurrent-state-zeroed": True,
    "recurrent-state-stale": True,
    "state-reset-near-source": True,
    "state-reset-far-from-source": False,
}

# How far (tokens) the "far" reset keeps from the source, its answer's keys and the query.
FAR = 24


def reset_position(name: str, source: int, prompt: int, steps: int) -> int | None:
    """Where the state-reset rows zero the Gated DeltaNet state (a prefill of PROMPT tokens
    whose answer reads the keys at SOURCE..SOURCE+STEPS-1), or None for the other rows.
    The model has no chunks: only the distance from the source matters, so the boundary is
    placed relative to it (3 tokens before it, as the H200 fault cell's 3k-004: source 131,
    hit boundary 128); "far" lies FAR tokens after the answer's keys, or, where the prompt
    ends too soon for that, FAR tokens before the source."""
    if name == "state-reset-near-source":
        return source - 3
    if name == "state-reset-far-from-source":
        after = source + steps + FAR
        return after if after <= prompt - FAR else max(1, source - FAR)
    return None


@dataclass(frozen=True)
class MatrixRow:
    corruption: str
    request: str
    expected: tuple[int, ...]
    answer: tuple[int, ...]
    margin: float  # smallest top-1 minus top-2 logit over the answer (nats)

    @property
    def changed(self) -> bool:
        return self.answer != self.expected

    @property
    def as_expected(self) -> bool:
        return self.changed == EXPECTED_CHANGE[self.corruption]


class CopyRunner:
    """transformers on CPU: prefill a cache, corrupt it, continue greedily."""

    def __init__(self, model_dir: Path, dtype: str = "bfloat16") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype)).eval()
        # transformers 5 renamed past_key_values to cache (and warns about the old name)
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def prefill(self, ids: Sequence[int], split: int | None = None) -> tuple[Any, Any]:
        """The cache after IDS, and a copy of the Gated DeltaNet states at SPLIT tokens
        (the previous chunk boundary: what a stale state would be)."""
        from transformers import DynamicCache

        torch = self.torch
        cache = DynamicCache(config=self.model.config)
        stale = None
        parts = [list(ids)] if split is None else [list(ids[:split]), list(ids[split:])]
        with torch.no_grad():
            for n, part in enumerate(parts):
                self.model(input_ids=torch.tensor([part]), use_cache=True,
                           **{self.cache_kw: cache})
                if n == 0 and split is not None:
                    stale = [(layer.conv_states[0].clone(), layer.recurrent_states[0].clone())
                             for layer in linear_layers(cache)]
        return cache, stale

    def prefill_reset(self, ids: Sequence[int], at: int) -> Any:
        """The cache after IDS with every Gated DeltaNet layer's conv and recurrent state
        zeroed after the first AT tokens: attention KV is exact throughout."""
        from transformers import DynamicCache

        torch = self.torch
        cache = DynamicCache(config=self.model.config)
        with torch.no_grad():
            for n, part in enumerate((list(ids[:at]), list(ids[at:]))):
                self.model(input_ids=torch.tensor([part]), use_cache=True,
                           **{self.cache_kw: cache})
                if n == 0:
                    for layer in linear_layers(cache):
                        layer.conv_states[0].zero_()
                        layer.recurrent_states[0].zero_()
        return cache

    def continue_greedy(self, cache: Any, last: int, steps: int) -> tuple[list[int], float]:
        (one,) = self.continue_batch(cache, [last], steps)
        return one

    def continue_batch(self, cache: Any, lasts: Sequence[int], steps: int
                       ) -> list[tuple[list[int], float]]:
        """Greedy continuations of every batch row of CACHE (row i after LASTS[i]), each
        with its smallest top-1 minus top-2 logit: one forward a step for all rows."""
        torch = self.torch
        tokens = list(lasts)
        outs: list[list[int]] = [[] for _ in tokens]
        margins = [float("inf")] * len(tokens)
        with torch.no_grad():
            for _ in range(steps):
                logits = self.model(input_ids=torch.tensor([[t] for t in tokens]),
                                    use_cache=True,
                                    **{self.cache_kw: cache}).logits[:, -1].float()
                top = logits.topk(2, dim=-1).values
                tokens = [int(t) for t in logits.argmax(dim=-1)]
                for row, token in enumerate(tokens):
                    margins[row] = min(margins[row], float(top[row, 0] - top[row, 1]))
                    outs[row].append(token)
        return list(zip(outs, margins, strict=True))


def batched(caches: Sequence[Any]) -> Any:
    """One cache whose batch rows are CACHES (single-row caches of one length), built in
    the first one: the corruptions of a request are continued in one batch."""
    import torch

    merged = caches[0]
    for i, layer in enumerate(merged.layers):
        if hasattr(layer, "conv_states"):
            layer.conv_states[0] = torch.cat([c.layers[i].conv_states[0] for c in caches])
            layer.recurrent_states[0] = torch.cat(
                [c.layers[i].recurrent_states[0] for c in caches])
        else:
            layer.keys = torch.cat([c.layers[i].keys for c in caches])
            layer.values = torch.cat([c.layers[i].values for c in caches])
    return merged


def linear_layers(cache: Any) -> list[Any]:
    return [layer for layer in cache.layers if hasattr(layer, "conv_states")]


def attention_layers(cache: Any) -> list[Any]:
    return [layer for layer in cache.layers if not hasattr(layer, "conv_states")]


def _ulp_noise(tensor: Any, seed: int) -> None:
    import torch

    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16,
            torch.float32: torch.int32}[tensor.dtype]
    gen = torch.Generator().manual_seed(seed)
    step = torch.randint(0, 2, tensor.shape, generator=gen).mul_(2).sub_(1).to(bits)
    raw = tensor.view(bits)
    raw.add_(torch.where(tensor != 0, step, torch.zeros_like(step)))


def corrupt(name: str, cache: Any, stale: Any, foreign: Any, chunk: int, source_chunk: int,
            other_chunk: int) -> None:
    """Apply one corruption to a prefilled cache in place."""
    def rows(c: int) -> slice:
        return slice(c * chunk, (c + 1) * chunk)

    if name == "clean":
        return
    if name == "noise-1ulp":
        for seed, layer in enumerate(cache.layers):
            for t in ((layer.keys, layer.values) if not hasattr(layer, "conv_states")
                      else (layer.conv_states[0], layer.recurrent_states[0])):
                _ulp_noise(t, seed)
        return
    if name in ("lost-source-chunk", "lost-other-chunk"):
        c = source_chunk if name == "lost-source-chunk" else other_chunk
        for layer in attention_layers(cache):
            layer.keys[:, :, rows(c)] = 0
            layer.values[:, :, rows(c)] = 0
        return
    if name == "foreign-source-chunk":
        for layer, theirs in zip(attention_layers(cache), attention_layers(foreign),
                                 strict=True):
            layer.keys[:, :, rows(source_chunk)] = theirs.keys[:, :, rows(source_chunk)]
            layer.values[:, :, rows(source_chunk)] = theirs.values[:, :, rows(source_chunk)]
        return
    if name == "permuted-chunks":
        a, b = rows(source_chunk), rows(other_chunk)
        for layer in attention_layers(cache):
            for t in (layer.keys, layer.values):
                first = t[:, :, a].clone()
                t[:, :, a] = t[:, :, b]
                t[:, :, b] = first
        return
    for layer, (conv, recurrent) in zip(linear_layers(cache), stale, strict=True):
        if name in ("state-zeroed", "conv-state-zeroed"):
            layer.conv_states[0].zero_()
        if name in ("state-zeroed", "recurrent-state-zeroed"):
            layer.recurrent_states[0].zero_()
        if name == "state-stale":
            layer.conv_states[0].copy_(conv)
        if name in ("state-stale", "recurrent-state-stale"):
            layer.recurrent_states[0].copy_(recurrent)


# A directory where a run keeps matrices it computed, keyed by model digest and inputs, so
# the self-tests compute each one once per run (the shipped suite's model check, run inside
# a self-test, and the matrix's own test send the same requests). Unset: always computed.
CACHE_ENV = "SHAREDKV_MATRIX_CACHE"


def run_matrix(model_dir: Path, requests: Sequence[tuple[str, list[int], int, int]],
               chunk: int, corruptions: Sequence[str] = tuple(EXPECTED_CHANGE),
               steps: int = 16, dtype: str = "bfloat16",
               progress: Callable[[MatrixRow], None] | None = None) -> list[MatrixRow]:
    """REQUESTS: (id, ids with <s>, source chunk, source position), all the same length."""
    cache = os.environ.get(CACHE_ENV)
    if not cache or progress is not None:
        return _run_matrix(model_dir, requests, chunk, corruptions, steps, dtype, progress)
    import hashlib
    import json

    from filelock import FileLock

    from pytest_sharedkv.models.copy_model import digest_of

    key = hashlib.sha256(json.dumps([digest_of(model_dir), [list(r) for r in requests], chunk,
                                     list(corruptions), steps, dtype]).encode()).hexdigest()
    path = Path(cache) / f"copy-matrix-{key[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if path.exists():
            return [MatrixRow(r["corruption"], r["request"], tuple(r["expected"]),
                              tuple(r["answer"]), r["margin"])
                    for r in json.loads(path.read_text())]
        rows = _run_matrix(model_dir, requests, chunk, corruptions, steps, dtype, None)
        path.write_text(json.dumps([dataclasses.asdict(r) for r in rows]))
        return rows


def _run_matrix(model_dir: Path, requests: Sequence[tuple[str, list[int], int, int]],
                chunk: int, corruptions: Sequence[str], steps: int, dtype: str,
                progress: Callable[[MatrixRow], None] | None) -> list[MatrixRow]:
    runner = CopyRunner(model_dir, dtype)
    # One prefill per request: request n+1's cache is request n's foreign KV (another
    # prompt's), and every corruption of a request is a row of one batch.
    prefilled = [runner.prefill(ids[:-1], split=len(ids) - 1 - chunk)
                 for _, ids, _, _ in requests]
    rows: list[MatrixRow] = []
    for n, (rid, ids, source_chunk, source) in enumerate(requests):
        expected = tuple(ids[source:source + steps])
        prefix, last = ids[:-1], ids[-1]
        chunks = len(prefix) // chunk
        other = (source_chunk + chunks // 2) % (chunks - 1)
        pristine, stale = prefilled[n]
        foreign, _ = prefilled[(n + 1) % len(requests)]
        caches = []
        for name in corruptions:
            at = reset_position(name, source, len(prefix), steps)
            if at is not None:
                caches.append(runner.prefill_reset(prefix, at))
                continue
            cache = copy.deepcopy(pristine)
            corrupt(name, cache, stale, foreign, chunk, source_chunk, other)
            caches.append(cache)
        answers = runner.continue_batch(batched(caches), [last] * len(caches), steps)
        for name, (answer, margin) in zip(corruptions, answers, strict=True):
            row = MatrixRow(name, rid, expected, tuple(answer), margin)
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows


def table(rows: Sequence[MatrixRow]) -> list[str]:
    """Markdown: corruption -> changed answers / requests, expected, min margin."""
    from pytest_sharedkv.report.markdown import markdown_table
    names = list(dict.fromkeys(r.corruption for r in rows))
    body = []
    for name in names:
        group = [r for r in rows if r.corruption == name]
        changed = sum(r.changed for r in group)
        ok = all(r.as_expected for r in group)
        body.append([name, f"{changed}/{len(group)}",
                     "changed" if EXPECTED_CHANGE[name] else "unchanged",
                     "yes" if ok else "NO", f"{min(r.margin for r in group):.1f}"])
    return markdown_table(["corruption", "answers changed", "must be", "as expected",
                           "min margin (nats)"], body)
