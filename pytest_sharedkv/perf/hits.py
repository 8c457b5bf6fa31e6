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


def hosts_steps(observations: Iterable[Observation], step: str) -> list[Observation]:
    """Measured HOSTS observations of STEP on B (whose server's log was read)."""
    return [o for o in observations
            if o.arm == "HOSTS" and o.step == step and o.replica == "B" and not o.warmup]


def _hop_untimed(o: Observation) -> bool:
    """Whether B's server, by its own account, took some of the keys from its L1 or none
    from the L2 (False where its account is unknown)."""
    return o.l2_keys is not None and ((o.l1_keys or 0) > 0 or not o.l2_keys)


def l2_origin(observations: Iterable[Observation]) -> str | None:
    """What B's server said of the HOSTS cross-replica lookups: each from its L2, or which
    were not (None: no HOSTS cross-replica requests)."""
    cross = hosts_steps(observations, "cross")
    if not cross:
        return None
    known = [o for o in cross if o.l2_keys is not None]
    unknown = len(cross) - len(known)
    from_l1 = [o for o in known if _hop_untimed(o)]
    if not known:
        return ("HOSTS: where B's server took the keys is unknown (it logged no lookup of "
                "these requests)")
    text = (f"HOSTS: {len(known) - len(from_l1)} of {len(cross)} from B's server's L2 by "
            f"its own log ({sum(o.l2_keys or 0 for o in known)} keys from the L2, "
            f"{sum(o.l1_keys or 0 for o in known)} from its L1)")
    if unknown:
        text += f"; {unknown} with no lookup logged (unknown)"
    return text


def not_from_l2(observations: Iterable[Observation]) -> list[str]:
    """Refusals: a HOSTS cross-replica request whose keys B's server took from its own L1
    (or none from the L2): its TTFT did not time the hop the arm measures."""
    return [f"request {o.request} (block {o.block}, HOSTS cross on B): B's server took "
            f"{o.l1_keys} keys from its L1 and {o.l2_keys} from the L2, so this TTFT did not "
            "time the L2"
            for o in hosts_steps(observations, "cross") if _hop_untimed(o)]


def l2_reloads(observations: Iterable[Observation]) -> str | None:
    """The HOSTS receiver-local requests whose keys B's server loaded from the L2 again
    (None: none known to)."""
    again = [o for o in hosts_steps(observations, "receiver-local") if o.l2_keys]
    if not again:
        return None
    return (f"NOTE hits: {len(again)} HOSTS receiver-local request(s) waited for B's server "
            f"to load {sum(o.l2_keys or 0 for o in again)} keys from the L2 again (its own "
            "log), after the cross-replica step had loaded them: their TTFT holds that load")
