"""Whether a cross-replica request with the pool came from the pool whole.

The engine reports per request how many prompt tokens came from a cache
(``usage.prompt_tokens_details.cached_tokens``: its own prefix cache or the connector's
pool). B has never seen a cross-replica prompt, so with the shared pool (arm ON) every
chunk of it but the last, partial one should come from the pool: the hit the screening
means to time. Fewer tokens mean the pool evicted part of the prompt before B asked (a
pool too small for one size's requests) or B's lookup missed; that request's TTFT is a
transfer plus a recompute, not a transfer, and it is marked PARTIAL rather than averaged
in silently. With no chunk size (external endpoints without ``--sharedkv-chunk-size``) or
no cached-token counts from the engine, nothing is judged and the text says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from pytest_sharedkv.perf.observations import Observation

# the arms whose B hits what A stored (HOSTS: through the L2); NATIVE offloads per
# replica: B cannot hit what A offloaded
POOLED_ARMS = ("ON", "HOSTS")


def full_hit_tokens(prompt_tokens: int, chunk: int) -> int:
    """The cached tokens of a full hit: every whole chunk short of the last token (the
    engine always computes at least one)."""
    return max(prompt_tokens - 1, 0) // chunk * chunk


def pooled_cross(observations: Iterable[Observation]) -> list[Observation]:
    """Measured cross-replica observations of an arm with a shared pool."""
    return [o for o in observations
            if o.step == "cross" and o.arm in POOLED_ARMS and not o.warmup]


def partial_hits(observations: Iterable[Observation], chunk: int | None
                 ) -> list[Observation]:
    """Pooled cross-replica observations that found less than a full hit; none where the
    chunk is unknown, and none for observations without a cached-token count."""
    if not chunk:
        return []
    return [o for o in pooled_cross(observations) if o.cached_tokens is not None
            and o.cached_tokens < full_hit_tokens(o.prompt_tokens, chunk)]


def cached_share(observations: Iterable[Observation]) -> float | None:
    """The median share of the prompt served from a cache, where the engine said."""
    shares = [o.cached_tokens / o.prompt_tokens for o in observations
              if o.cached_tokens is not None and o.prompt_tokens > 0]
    return statistics.median(shares) if shares else None


def counted(observations: Iterable[Observation]) -> list[Observation]:
    return [o for o in observations if o.cached_tokens is not None]
