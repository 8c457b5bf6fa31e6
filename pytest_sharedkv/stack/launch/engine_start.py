"""Where a launched pair's start went: the suite's own ready time for each process, and
the phases vLLM logs for its engines (weights, torch.compile, profiling run, graph capture).
A real-compute block's restart is minutes; this says which part, so that a slow start is
read from the report, not guessed. Reported only, never judged: a phase the log does not
name (an eager engine compiles nothing, another vLLM words it otherwise) is absent, not 0.

Also each engine's GPU KV cache in tokens, as vLLM 0.26.0 logs it once its cache is made
(``kv_cache_utils.py``: ``GPU KV cache size: 419,424 tokens``, then ``Maximum concurrency
for 4,096 tokens per request: 102.40x``): what the service tier judges a size group's
local steps by (a group whose KV does not fit is evicted from the replica's own prefix
cache before the step asks again). No such line is unknown (None), never 0."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# vLLM 0.26's own lines (gpu_model_runner, compilation monitor, engine core)
VLLM_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("weights", re.compile(r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds")),
    ("torch.compile", re.compile(r"torch\.compile took ([\d.]+) s in total")),
    ("profiling/warmup", re.compile(r"Initial profiling/warmup run took ([\d.]+) s")),
    ("graph capture", re.compile(r"Graph capturing finished in ([\d.]+) secs")),
    ("engine init", re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")),
)
READY = "ready"  # the suite's own measure: launch to serving (HTTP ready)
# vLLM 0.26's kv_cache_utils: "GPU KV cache size: 419,424 tokens" (a thousands comma)
GPU_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


def vllm_phases(log: str) -> dict[str, float]:
    """The phases LOG (one engine's start) names, in seconds; the last of each (a log
    that holds an earlier start too)."""
    phases: dict[str, float] = {}
    for name, pattern in VLLM_PHASES:
        found = pattern.findall(log)
        if found:
            phases[name] = float(found[-1])
    return phases


def gpu_kv_tokens(log: str) -> int | None:
    """The GPU KV cache one engine's start LOG names, in tokens (the last such line: a log
    that holds an earlier start too); None where it names none (unknown, never 0)."""
    found = GPU_KV_TOKENS.findall(log)
    return int(found[-1].replace(",", "")) if found else None


def describe(starts: Mapping[str, Mapping[str, float]]) -> str:
    """``lmcache server ready 68.2 s; vllm replica A ready 330.1 s (weights 3.8 s,
    torch.compile 144.6 s, ...)`` for each process of one start."""
    parts = []
    for process, phases in starts.items():
        ready = phases.get(READY)
        head = f"{process} ready {ready:.1f} s" if ready is not None else f"{process}"
        rest = [f"{name} {phases[name]:.1f} s" for name, _ in VLLM_PHASES if name in phases]
        parts.append(f"{head} ({', '.join(rest)})" if rest else head)
    return "; ".join(parts)


def starts_note(launches: Sequence[Mapping[str, object]]) -> str | None:
    """One line for the report: each block's start (the restart the screening timed,
    ``restart_s``) and where its processes' time went (``start``); None where no launch
    recorded its start."""
    blocks = []
    for index, launch in enumerate(launches):
        starts = launch.get("start")
        if not isinstance(starts, Mapping) or not starts:
            continue
        seconds = launch.get("restart_s")
        total = f" {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        blocks.append(f"block {index} ({launch.get('arm', '?')}){total}: {describe(starts)}")
    return "engine starts: " + " | ".join(blocks) if blocks else None
