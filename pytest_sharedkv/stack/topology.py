"""Where a pair's KV lives between its replicas: one LMCache server both use (``shared``,
as on one host), or one server per replica sharing only an L2 (``hosts``, as on two
hosts). A launch asks for the second with a ``HostsSpec``; the pair it gets carries a
``Topology``, what the tiers read of its servers: the L2 (to wait until it holds what A
stored), each server's log (where a lookup's keys came from, L1 or L2) and each server's
count of L1 evictions.

A count that could not be read is None (unknown), never 0: the eviction counter is read
from the server's metrics (LMCache 0.5.6's ``lmcache_mp_l1_evicted_chunks``, served on its
HTTP port when observability is on), and a server that counted writes and no eviction has
evicted nothing.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.stack.l2.log import KeySplit, split_for_tag, splits_by_tag

if TYPE_CHECKING:
    from pytest_sharedkv.stack.l2.backends import L2, Held

SHARED, HOSTS = "shared", "hosts"
EVICTED = "lmcache_mp_l1_evicted_chunks"  # OTel counter "lmcache_mp.l1_evicted", unit chunks
WRITTEN = "lmcache_mp_l1_write_chunks"  # present once the server counted anything
L2_DEADLINE_S = 60.0  # the wait for the L2 after A's step: its floor
L2_DEADLINE_S_PER_TOKEN = 20e-6  # and what it grows by per prompt token stored, at least
# the stored bytes at this rate: a third of the slowest fs L2 write measured on CPU (64 MiB
# complete in 0.38 s), so a model storing 262,144 B a token gets a deadline its size
L2_SLOWEST_BYTES_PER_S = 60e6
POLL_S = 0.01


def l2_deadline_s(tokens: int, bytes_per_token: int | None = None) -> float:
    """How long the L2 may take to hold what A stored: L2_DEADLINE_S, and per token
    L2_DEADLINE_S_PER_TOKEN or its bytes at L2_SLOWEST_BYTES_PER_S, whichever is longer."""
    per_token = L2_DEADLINE_S_PER_TOKEN
    if bytes_per_token:
        per_token = max(per_token, bytes_per_token / L2_SLOWEST_BYTES_PER_S)
    return L2_DEADLINE_S + per_token * tokens


@dataclass(frozen=True)
class HostsSpec:
    """A launch in the hosts topology: the L2 both servers share (ADAPTER, its --l2-adapter
    JSON; L2, how the report names it), server 2's own adapter where it differs (the fault
    cells wrap it in LMCache's fault_inject), and the cell the launch is for."""

    adapter: str
    l2: str
    reader_adapter: str | None = None
    cell: str | None = None

    @property
    def adapters(self) -> tuple[str, str]:
        """Server 1's adapter, server 2's."""
        return self.adapter, self.reader_adapter or self.adapter

    def record(self) -> dict[str, Any]:
        return {"l2": self.l2, "adapters": [json.loads(a) for a in self.adapters],
                "cell": self.cell}


def l1_evictions(metrics: str) -> int | None:
    """The L1 evictions a server's metrics text counted; None where it counted nothing
    at all (no counter read)."""
    from pytest_sharedkv.stack.metrics import parse_counters

    counters = parse_counters(metrics)
    if EVICTED in counters:
        return int(counters[EVICTED])
    return 0 if WRITTEN in counters else None


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())
    except (OSError, urllib.error.URLError, ValueError):
        return None


@dataclass(frozen=True)
class ServerView:
    """One LMCache server as the tiers read it: NAME ("server", or "server 1"/"server 2"
    in the hosts topology), its log, and where its metrics are (the stub double's servers
    are halves of two processes: one URL each)."""

    name: str
    log: Callable[[], str]
    metrics_urls: tuple[str, ...] = ()
    counts_evictions: bool = True

    def evictions(self) -> int | None:
        if not self.metrics_urls or not self.counts_evictions:
            return None
        total = 0
        for url in self.metrics_urls:
            text = scrape(url)
            counted = l1_evictions(text) if text is not None else None
            if counted is None:
                return None
            total += counted
        return total


@dataclass(frozen=True)
class L2Wait:
    """The wait after A's step until the L2 held every chunk B will ask for: how long it
    took, and what was missing when its deadline passed (empty: nothing); ``listed`` False
    where the L2 cannot be listed (the settle stood in for it)."""

    seconds: float
    missing: tuple[str, ...] = ()
    listed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "missing": list(self.missing),
                "listed": self.listed}


@dataclass
class Topology:
    """A live pair's servers: NAME (shared or hosts), the L2 they share (hosts), and the
    servers, in replica order (hosts: server 1 is A's, server 2 is B's)."""

    name: str
    servers: tuple[ServerView, ...]
    l2: L2 | None = None
    spec: HostsSpec | None = None
    chunk: int | None = None  # the servers' chunk size in tokens

    @property
    def hosts(self) -> bool:
        return self.name == HOSTS

    def server_of(self, replica: str) -> ServerView:
        if self.hosts and replica == "B" and len(self.servers) > 1:
            return self.servers[1]
        return self.servers[0]

    def split(self, tag: str, replica: str) -> KeySplit:
        """Where REPLICA's server took the keys of the request the suite sent as TAG."""
        return split_for_tag(self.server_of(replica).log(), tag)

    def splits(self, replica: str) -> dict[tuple[str, str, str], KeySplit]:
        """Every lookup REPLICA's server logged of the suite's requests, by tag."""
        return splits_by_tag(self.server_of(replica).log())

    def evictions(self) -> dict[str, int | None]:
        """The L1 evictions each server counted so far."""
        return {s.name: s.evictions() for s in self.servers}

    def describe(self) -> str:
        if not self.hosts:
            return "shared (one LMCache server)"
        cell = f", cell {self.spec.cell}" if self.spec is not None and self.spec.cell else ""
        where = self.spec.l2 if self.spec is not None else "an L2"
        return f"hosts (one LMCache server per replica, sharing {where}{cell})"

    def wait_l2(self, chunks: Mapping[str, int], tokens: int,
                alive: Callable[[], bool] = lambda: True,
                bytes_per_token: int | None = None) -> L2Wait:
        """Poll until the L2 holds CHUNKS[salt] whole chunks of each salt (the deadline:
        l2_deadline_s of the TOKENS stored, at BYTES_PER_TOKEN where known); L2Wait says
        what was missing when it passed. ``listed`` False where the L2 cannot be listed."""
        started = time.monotonic()
        deadline = l2_deadline_s(tokens, bytes_per_token)
        if self.l2 is None:
            return L2Wait(0.0, listed=False)
        waiting = {salt: need for salt, need in chunks.items() if need > 0}
        last: dict[str, Held | None] = {}
        while waiting:
            for salt in list(waiting):
                held = self.l2.held(salt)
                last[salt] = held
                if held is None:
                    return L2Wait(time.monotonic() - started, listed=False)
                if held.whole >= waiting[salt]:
                    del waiting[salt]
            if not waiting or time.monotonic() - started > deadline or not alive():
                break
            time.sleep(POLL_S)
        seconds = time.monotonic() - started
        missing = tuple(f"salt {salt}: {held.describe() if held else 'nothing'} of the "
                        f"{need} chunk(s) B asks for"
                        for salt, need in waiting.items() for held in (last.get(salt),))
        if missing:
            count = self.l2.count()
            entries = "an unreadable number of" if count is None else str(count)
            missing = (f"{self.l2.describe()} held {entries} entries {seconds:.1f} s after "
                       f"A's step (deadline {deadline:.0f} s); {len(waiting)} of {len(chunks)}"
                       " salts short", *missing)
        return L2Wait(seconds, missing)
