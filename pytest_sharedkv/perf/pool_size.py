"""How large the ON arm's pool must be: what the pool stores for a prompt, as the engine
lays its KV out, not what the model's geometry needs.

For a hybrid model (Gated DeltaNet + attention) with prefix caching, vLLM raises the
attention block until one attention layer's page holds a recurrent layer's state, and pads
each recurrent page to that size (``vllm/platforms/interface.py``,
``_align_hybrid_block_size``, vLLM 0.26). LMCache 0.5.6 stores every layer's page of each
block, the recurrent layers' included (``kv_cache_group_edits._MambaPageViewEdit``: a
recurrent page is kept like a one-block sliding window; tail-only transfer is deferred
there). So a stored token costs every layer's attention bytes: for the 27B geometry 64 x
4,096 = 262,144 bytes, four times the 65,536 KV bytes the floor counts. On the H200
(vLLM 0.26, LMCache 0.5.6) an ON pool sized from the geometry, 16 GB for three 32k
requests that store ~26 GB this way, served the cross-replica requests 72% of their
prompt on average, where a full hit is all of it but the last token.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_sharedkv.perf.floor import FloorError, kv_geometry, layer_counts

MARGIN = 1.1  # pool metadata and allocator slack over the bytes stored
MINIMUM_GB = 8.0
HOST_SHARE = 0.5  # never pin more than this share of the host's memory


def stored_bytes_per_token(config: Mapping[str, Any], where: str = "config.json") -> int:
    """Bytes the pool stores per prompt token: the KV bytes for an attention-only model;
    for a hybrid one every layer at one attention layer's bytes (see the module)."""
    kv, _ = kv_geometry(config, where=where)
    attention, linear = layer_counts(config, where)
    if not linear or not attention:
        return kv
    return (attention + linear) * (kv // attention)


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class PoolSize:
    """The ON arm's pool and how a screening must use it: ``one_by_one`` names the sizes
    whose requests do not fit the pool together, so each request runs its four steps
    before the next one's cold step (the pool then needs to hold one of them)."""

    gb: float
    why: str
    one_by_one: tuple[str, ...] = ()
    # sizes dropped from the screening: one request stores more than the host cap, so a
    # cross-replica step could only time a partial hit (the text says why)
    dropped: tuple[str, ...] = ()
    # the NATIVE arm's offload on each replica (vLLM's own, one per replica, both on this
    # host): the pool's size where two of them fit under the cap, else half the cap
    native_gb: float = MINIMUM_GB
    # the HOSTS arm's L1 on each of its two LMCache servers (both on this host), sized as
    # NATIVE's: two of them pin no more than the cap
    hosts_gb: float = MINIMUM_GB


def pool_size_gb(config: Mapping[str, Any], tokens_per_size: Mapping[str, Sequence[int]], *,
                 host_bytes: int | None = None, hosts_arm: bool = False,
                 l2_free_bytes: int | None = None) -> PoolSize:
    """A pool that keeps what each size's cross-replica step must find (that step comes
    after the cold and local steps, so a smaller pool evicts what B should hit and times a
    recompute as a transfer): a size's requests together, or one at a time where together
    they exceed HOST_SHARE of the host's memory; their stored bytes plus MARGIN, a power of
    two (torch rounds pinned requests up to one), at least MINIMUM_GB, at most the host
    cap (then the text says the largest size may not fit).

    With the HOSTS arm (HOSTS_ARM) two servers on this host each need a size's requests in
    their own L1, so each gets half the cap, and a size is dropped where one request needs
    more than that half, or where the kept sizes' stored bytes exceed L2_FREE_BYTES (the
    free space where a directory L2 writes; None: not known, nothing dropped for it)."""
    try:
        per_token = stored_bytes_per_token(config)
    except FloorError as exc:
        return PoolSize(MINIMUM_GB, f"the geometry is unknown ({exc}): the minimum")
    host = host_memory_bytes() if host_bytes is None else host_bytes
    cap = 2.0 ** math.floor(math.log2(host * HOST_SHARE / 1e9)) if host else None

    def pool_gb(stored: float) -> float:
        return MINIMUM_GB if stored <= 0 else max(
            MINIMUM_GB, 2.0 ** math.ceil(math.log2(stored * MARGIN / 1e9)))

    together = {size: sum(counts) * per_token for size, counts in tokens_per_size.items()}
    single = {size: max(counts, default=0) * per_token
              for size, counts in tokens_per_size.items()}
    # the cap of each pool: half the host's for the HOSTS arm's two servers
    each = cap / 2 if cap is not None and hosts_arm else cap
    reasons: dict[str, str] = {}
    for size in tokens_per_size:
        if cap is not None and pool_gb(single[size]) > cap:
            reasons[size] = (f"one request stores {single[size] / 1e9:.1f} GB, more than the "
                             f"{cap:g} GB cap, half this host's memory: its cross-replica "
                             "step could only time a partial hit")
        elif each is not None and pool_gb(single[size]) > each:
            reasons[size] = (f"one request stores {single[size] / 1e9:.1f} GB, more than the "
                             f"{each:g} GB each of the HOSTS arm's two LMCache servers may "
                             f"pin, two on this host under the {cap:g} GB cap: its "
                             "cross-host step could only time a partial hit")
    if hosts_arm and l2_free_bytes is not None:
        kept_l2 = sorted((s for s in tokens_per_size if s not in reasons),
                         key=lambda s: together[s])
        while len(kept_l2) > 1 and sum(together[s] for s in kept_l2) * MARGIN > l2_free_bytes:
            size = kept_l2.pop()
            reasons[size] = (f"the HOSTS arm's L2 would hold "
                             f"{sum(together[s] for s in (*kept_l2, size)) / 1e9:.1f} GB with "
                             f"it, more than the {l2_free_bytes / 1e9:.1f} GB free where the "
                             "L2 writes")
    dropped = tuple(size for size in tokens_per_size if size in reasons)
    if len(dropped) == len(tokens_per_size):
        dropped = ()  # nothing would be left: keep them all, said as PARTIAL below
    kept = [size for size in tokens_per_size if size not in dropped]
    one_by_one = tuple(size for size in kept if each is not None
                       and pool_gb(together[size]) > each and pool_gb(single[size]) <= each)
    need = max((single[s] if s in one_by_one else together[s] for s in kept), default=0)
    # what the pool is sized from: a dropped size's bytes are said with its drop
    largest = max(kept, key=lambda s: together[s], default=None)
    why = (f"the largest size's requests store {together[largest] / 1e9:.1f} GB at "
           f"{per_token:,} bytes a token as the engine lays the KV out"
           if largest is not None else "no requests")
    if one_by_one:
        why += "; " + ", ".join(
            f"{size} runs request by request ({together[size] / 1e9:.1f} GB together, "
            f"{single[size] / 1e9:.1f} GB each; the "
            + (f"cap of each HOSTS server is {each:g} GB)" if hosts_arm else
               f"host cap is {cap:g} GB)")
            for size in one_by_one)
    if dropped:
        why += "; " + ", ".join(f"{size} dropped ({reasons[size]})" for size in dropped)
    gb = pool_gb(need)
    if cap is not None and gb > cap:
        gb, why = max(cap, MINIMUM_GB), (f"{why}; capped at {cap:g} GB, half this host's "
                                         "memory: expect PARTIAL cross-replica hits")
    native = gb if cap is None or 2 * gb <= cap else cap / 2
    hosts = gb if each is None or gb <= each else max(each, MINIMUM_GB)
    if hosts_arm and hosts < pool_gb(need):
        why += (f"; each HOSTS server's L1 capped at {hosts:g} GB: expect PARTIAL "
                "cross-host hits")
    return PoolSize(gb, why, one_by_one, dropped, native_gb=native, hosts_gb=hosts)
