"""A stub OpenAI-compatible completion server: a TEST DOUBLE for the suite's own logic.

It is not an inference engine. It answers ``/health``, ``/v1/models``, ``/metrics`` and
``/v1/completions`` (streamed or not, with usage, ``cached_tokens``, logprobs, stop
strings and vLLM's ``return_token_ids``) and counts prompt-prefix hits per ``cache_salt``
the way a prefix cache would, in whole blocks. ``--pool DIR`` makes two stubs share a
directory the way two engines share an LMCache pool (blocks found there count as external
hits); without it a stub keeps only its own cache (the perf tier's OFF arm).
``--prefill-us U`` waits U microseconds per prompt token that no cache held before it
answers (before the first streamed token), so hits are faster than cold prefill, as in an
engine.

Prompts in the copy model's words (``w00 w01 ...``) are answered with the copy rule the
copy model implements in its weights (``service.copy_rule``); a prompt counts ``<s>`` as
its first token, and hits stop one token short of the prompt, as vLLM's do. Other prompts
get a deterministic hash continuation.

It can misbehave on purpose: ``--crash-after N`` exits after N completions,
``--never-ready`` keeps /health failing, ``--corrupt-external`` changes the answer whenever
a request hit the pool, ``--ignore-salt`` makes every namespace share blocks (a leak;
``--pool-ignores-salt`` in the pool alone, SGLang #37160's condition),
``--identity TEXT`` folds a model identity into its keys as a correct stack would (a block
another identity stored, found all the same, answers as stale KV; ``--identity-blind``
plants keys without it), ``--pool-blocks N`` keeps at most N blocks in the pool, oldest
out (a pool too small),
``--diverge`` answers copy prompts one word off even cold (a model fault, not a cache
fault), and ``--corrupt-control FILE`` zeroes the chunks the file names in every pool hit
(the service tier's sensitivity gate, as the launched server's hook does; ``--corrupt-log``
gets a line per zeroed chunk), and ``--fail-metrics 3,7`` answers the 3rd and 7th GET
/metrics with HTTP 503 (a failed Prometheus scrape). Every response
carries ``X-Sharedkv-Test-Double: 1``.

``--offload-log`` (the NATIVE arm: a pool of its own) prints a vLLM-shaped "KV Transfer
metrics" line for each request that stored blocks to its pool or loaded them back (at
``STUB_TOKEN_BYTES`` a token), as vLLM's OffloadingConnector logs its stats.
``--no-prefix-caching`` (vLLM's ``--no-enable-prefix-caching``): its own cache serves
nothing, so every hit comes from the pool (the in-process stack, LMCache's ``local_cpu``
serving what the GPU prefix cache would have). ``--twins-diverge`` (a planted fault,
LMCache #4463's later report): identical requests (one prompt, one salt) in flight together
answer differently, each arriving while another is in flight one of its own.
``--sequence-diverge`` (a planted fault, LMCache #4463's later report: four sequential
requests, four answers): each request of a prompt whose KV came from the pool answers one
of its own, a different one each time. ``--boundary-diverge`` (a planted fault, vLLM
#51094): a copy prompt whose length is whole blocks (``<s>`` included), so its load from
the pool ends on a block edge one token short of the prompt's end, answers one word off;
every other prompt as constructed.
``--gpu-blocks N`` keeps at most N blocks in the stub's own cache (the GPU's prefix cache),
least recently used out, so a prompt evicted from it is served from its pool (vLLM's
native offload under the service tier: hits from the GPU and the replica's CPU tier, in
whatever mix eviction left, both counted as vLLM counts them); on a shared pool the same
cache pushes a size group that does not fit out before its local step asks again, so that
step is served from the pool. The stub logs that cache's size at start as vLLM 0.26.0
does (``GPU KV cache size: N tokens``, N blocks of ``--block`` tokens), or
``--gpu-kv-tokens N`` in its place (a start log that says more, or less, than the cache
keeps); with neither it logs no size (unknown).

The server's hooks have stand-ins, so the fault catalogue and the triage's remedy cells run
on CPU through the code that judges them on a GPU: ``--fault-control FILE --fault-log
FILE`` applies the catalogue's hook classes as ``engine_hooks.fault_hook`` does (the same
control file and the same log lines; a store class where the stub puts blocks in the pool,
a retrieve class where it loads them), with each class's effect on answers and audit
digests (``fault_classes``: a misroute leaves the copy model's answer exact, a collision or
a lost write hides the chunk, unrestored or foreign state puts the answer one word off);
``--stream-remedy NAME --stream-remedy-log FILE`` logs a remedy's lines as
``stream_remedy_hook`` does, one a pool transfer; ``--inject-log FILE`` logs each pool
transfer as the delay hook does in the server. ``--race-unless-remedy NAME`` and
``--race-under-delay`` are planted races: B's pool hits answer as from stale KV unless the
named remedy is on, or while the delay is; ``--no-hooks`` is a server whose hooks never
loaded (the switches above do nothing).

``--kv-audit DIR`` writes the in-engine KV audit's records (``kv_audit_hook``'s format,
read by ``service.kv_audit``) so the suite's audit test runs on CPU: a ``store`` digest
per block the stub puts in the pool and a ``load`` digest per block it takes from it, keyed
as the hook keys chunks (cache salt and token ids up to the chunk's end; a stub token's
id is a hash of its word). The stub holds no KV: a block's "bytes" are a function of its
key, and what it loads is what it stored unless the gate zeroed that chunk (zeros) or
``--corrupt-external`` is on (other bytes), as the answers it gives.

The hosts topology (``--l2-adapter JSON``, the same JSON an LMCache server takes, a
``fault_inject`` wrapper included): ``--pool`` is then this stub's own server's L1, and
the L2 the adapter names (a directory or a Redis) is what the two stubs share. A block is
stored in the L1 and written to the L2 as an entry named as LMCache names it
(``stub@0x00000000@0@<chunk hash>@<salt>``, ``.data`` in a directory), holding bytes that
are a function of its key; a lookup takes the L1 first, then the L2 (a fault_inject gap
index fails that load, so the lookup stops there), and puts what it took from the L2 in
the L1, and logs LMCache's ``retained keys (a L1, b L2)`` line under vLLM's engine id
(``cmpl-<X-Request-Id>-0-<hash>``). An entry whose bytes are not its key's answers as stale
KV would (and the audit's load digest is of the bytes read). A write the L2 refuses (a
read-only directory, a Redis at its memory limit) is logged and the block stays in the L1
only. ``--pool-blocks`` is the L1's size; ``GET /server/metrics`` gives LMCache's L1
write and eviction counters. ``--l2-flip-chunk N`` flips a byte of chunk N's entry in the
L2 right after this stub wrote it (a byte changed in L2), and ``--l2-unattached`` logs the
native connector's error instead of the adapter's attach line (a server that serves
without its L2).

    python -m pytest_sharedkv.stack.stub.stub_openai --port P [--pool DIR] [--block N] ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from pytest_sharedkv.engine_hooks.kv_audit_hook import AuditLog, chunk_keys

BLOCK = 16
STUB_TOKEN_BYTES = 1024  # what --offload-log says a stored or loaded token weighs
SGLANG = "sglang"  # --engine sglang: usage and /metrics as SGLang 0.5.17 gives them
COPY_WORD = re.compile(r"^(w\d\d|<miss>)$")
# --twins-diverge: the longest a request stays in flight waiting for its twins; once one
# came, it stays until none came for TWIN_QUIET_S (twins sent together overlap, no sleep)
TWIN_WAIT_S = 1.0
TWIN_QUIET_S = 0.2


@dataclass(frozen=True)
class _ServerLookup:
    """What this stub's server made of one lookup in the hosts topology: its split
    (retained, requested, from L1, from L2) and the chunks it read from the L2 whose bytes
    were not their key's."""

    split: tuple[int, int, int, int] = (0, 0, 0, 0)
    stale: frozenset[int] = frozenset()  # chunks whose L2 bytes were not their key's


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str = args.name
        self.pool: Path | None = args.pool
        self.completions = 0
        self.hits = 0
        self.external_hits = 0
        self.queries = 0
        self.scrapes = 0  # GET /metrics so far
        self.blocks: set[str] = set()
        self.gpu_order: OrderedDict[str, None] = OrderedDict()  # --gpu-blocks: its LRU
        self.lock = threading.Lock()
        self.l2, self.gaps = _l2_of(args.l2_adapter)
        self.l1_writes = 0  # blocks this stub put in its server's L1
        self.evicted = 0  # blocks its L1 evicted
        self.prefetches = 0
        self.l1_order: OrderedDict[str, None] = OrderedDict()  # the hosts topology's L1, LRU
        self.in_flight: dict[tuple[str, str], int] = {}  # --twins-diverge: (salt, prompt)
        # --twins-diverge: (salt, prompt) -> (requests come since one was first in flight,
        # when the last came)
        self.arrived: dict[tuple[str, str], tuple[int, float]] = {}
        self.twin_came = threading.Condition(self.lock)
        self.pool_served: dict[tuple[str, str], int] = {}  # --sequence-diverge: (salt, prompt)
        self.last = _ServerLookup()  # the hosts topology: this request's server lookup
        # --identity: what else than the salt a correct stack folds into its keys (weights,
        # RoPE scaling, kv-cache dtype, adapter); --identity-blind (planted) leaves it out
        self.identity: str = args.identity
        self.key_identity = "" if args.identity_blind else args.identity
        self.foreign = False  # the last lookup loaded blocks another identity stored
        self.audit: AuditLog | None = None
        self.hooks = _Hooks(args)
        if args.kv_audit is not None:
            self.audit = AuditLog(args.kv_audit, self.name)
            self.audit.write([
                {"kind": "installed", "pid": os.getpid(), "test_double": True},
                {"kind": "registered", "test_double": True, "chunk": args.block,
                 "groups": [{"layers": [0], "tokens_per_block": args.block,
                             "recurrent": False}], "tensors": {"stub": []}}])

    @property
    def stale_pool(self) -> bool:
        """Whether B's pool hits answer as from stale KV: --corrupt-external, or a planted
        race that its remedy (or the absence of the delay) does not lift."""
        args = self.args
        return bool(args.corrupt_external
                    or (args.race_unless_remedy and args.stream_remedy != args.race_unless_remedy)
                    or (args.race_under_delay and args.inject_log is not None))

    def lookup(self, salt: str, tokens: list[str], block: int, limit: int
               ) -> tuple[int, int, list[int], tuple[str, ...]]:
        """(local, external) hit tokens: whole blocks of the first LIMIT tokens, in order;
        the indices of the blocks this call put in the pool; every block's pool key."""
        if self.args.ignore_salt:
            salt = ""
        identity = f"\x00{self.key_identity}" if self.key_identity else ""
        keys = _chain(f"{salt}{identity}", tokens, block, limit)
        self.foreign = False
        # --pool-ignores-salt (SGLang #37160): the engine's own cache keyed by the salt, the
        # pool's keys without it
        own = keys
        if self.args.pool_ignores_salt:
            keys = _chain(identity, tokens, block, limit)
        if self.l2 is not None:
            return self._hosts_lookup(salt, keys)
        local = external = 0
        pooled = set()
        for (end, key), (_, mine) in zip(keys, own, strict=True):
            if mine in self.blocks and external == 0 and not self.args.no_prefix_caching:
                local = end
            elif self.pool is not None and (self.pool / key).exists():
                external = end - local
                pooled.add(key)
                if self.identity and not self.foreign:  # whose KV it is (its bytes' maker)
                    self.foreign = _writer(self.pool / key) != self.identity
            else:
                break
        stored = []
        for index, ((_, key), (_, mine)) in enumerate(zip(keys, own, strict=True)):
            if mine not in self.blocks:  # stored once (creating files is slow on some disks)
                self.blocks.add(mine)
                if self.pool is not None and key not in pooled:
                    (self.pool / key).write_text(self.identity)  # "" where none is given
                    stored.append(index)
            self.used_on_gpu(mine)
        self.l1_writes += len(stored)
        if stored and self.args.pool_blocks is not None:
            self.evict(self.args.pool_blocks)
        return local, external, stored, tuple(key for _, key in keys)

    def twin_enter(self, salt: str, prompt: str) -> int:
        """--twins-diverge: how many identical requests were in flight as this one came
        (0: the first); it stays in flight until a twin comes and then none for
        TWIN_QUIET_S (at most TWIN_WAIT_S), so twins sent together overlap."""
        key = (salt, prompt)
        deadline = time.monotonic() + TWIN_WAIT_S
        with self.twin_came:
            ahead = self.in_flight.get(key, 0)
            self.in_flight[key] = ahead + 1
            came = self.arrived.get(key, (0, 0.0))[0] + 1
            self.arrived[key] = (came, time.monotonic())
            self.twin_came.notify_all()
            while (now := time.monotonic()) < deadline:
                came, last = self.arrived[key]
                if came == 1:  # alone so far: until a twin comes
                    self.twin_came.wait(deadline - now)
                elif now - last >= TWIN_QUIET_S:
                    break  # twins came, and none since TWIN_QUIET_S
                else:
                    self.twin_came.wait(min(deadline, last + TWIN_QUIET_S) - now)
        return ahead

    def twin_leave(self, salt: str, prompt: str) -> None:
        with self.lock:
            left = self.in_flight.pop((salt, prompt), 1) - 1
            if left:
                self.in_flight[(salt, prompt)] = left
            else:
                self.arrived.pop((salt, prompt), None)

    def used_on_gpu(self, key: str) -> None:
        """With --gpu-blocks: KEY used most recently, and the least recently used blocks
        out of the stub's own cache past its size (they stay in its pool)."""
        capacity = self.args.gpu_blocks
        if capacity is None:
            return
        self.gpu_order[key] = None
        self.gpu_order.move_to_end(key)
        while len(self.gpu_order) > capacity:
            old, _ = self.gpu_order.popitem(last=False)
            self.blocks.discard(old)

    def _hosts_lookup(self, salt: str, keys: list[tuple[int, str]]
                      ) -> tuple[int, int, list[int], tuple[str, ...]]:
        """The hosts topology: the engine's own blocks, then its server's L1 (--pool), then
        the shared L2 (a gap index of the L2 load stops it); what came from the L2 goes into
        the L1, every new block into the L1 and the L2. Sets the server's split of this
        lookup (self.split: retained, requested, L1, L2) and the blocks read from the L2."""
        assert self.pool is not None and self.l2 is not None
        local = external = 0
        l1 = l2 = 0
        l2_loads = 0
        read: dict[int, bytes] = {}
        for index, (end, key) in enumerate(keys):
            if (self.pool / key).exists():
                l1 += 1
            else:
                entry = _entry(salt, key, self.l2)
                if l2_loads in self.gaps:  # fault_inject: present, but its load fails
                    break
                data = self.l2.read(entry)
                l2_loads += 1
                if data is None:
                    break
                l2 += 1
                read[index] = data
            if key in self.blocks and external == 0:
                local = end
            else:
                external = end - local
        stale = frozenset(i for i, data in read.items()
                          if data != l2_entry(keys[i][1] + self.identity))
        self.last = _ServerLookup((l1 + l2, len(keys), l1, l2), stale)
        stored = []
        for index, (_, key) in enumerate(keys):
            if index < l1 and key in self.l1_order:  # read from its L1: used most recently
                self.l1_order.move_to_end(key)
            if key in self.blocks and index not in read:
                continue
            self.blocks.add(key)
            if not (self.pool / key).exists():
                (self.pool / key).touch()
                self.l1_order[key] = None
                self.l1_writes += 1
            if index < l1 + l2:  # the server had it: a prefetch, not a store
                continue
            stored.append(index)
            self._write_l2(salt, key, index)
        self.prefetches += 1
        capacity = self.args.pool_blocks
        while capacity is not None and len(self.l1_order) > capacity:  # its own L1: LRU
            old, _ = self.l1_order.popitem(last=False)
            (self.pool / old).unlink(missing_ok=True)
            self.evicted += 1
        return local, external, stored, tuple(key for _, key in keys)

    def _write_l2(self, salt: str, key: str, index: int) -> None:
        """Block INDEX into the L2, as LMCache's store controller writes it after L1; a
        write the L2 refuses is logged and the block stays in the L1 only."""
        assert self.l2 is not None
        entry = _entry(salt, key, self.l2)
        try:
            self.l2.write(entry, l2_entry(key + self.identity))  # another's: stale bytes
            if index == self.args.l2_flip_chunk:
                said = self.l2.corrupt(entry)
                print(f"[{self.name}] planted: {said}", flush=True)
        except Exception as exc:  # the L2's own error (OSError, a Redis OOM): logged
            print(f"[{self.name}] LMCache WARNING: L2 store failed for {entry}: "
                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                  flush=True)
            # and as LMCache 0.5.6's store controller says it (l2_log.store_failures)
            print(f"[{self.name}] LMCache WARNING: Store task {index} to adapter 0 failed "
                  f"for keys: [ObjectKey(chunk_hash={key[:32]!r}, model_name='stub', "
                  f"kv_rank=0, object_group_id=0, cache_salt='{salt}')]", flush=True)

    def evict(self, capacity: int) -> None:
        """A pool of CAPACITY blocks: the oldest stored go first, as an LRU pool's would
        when nothing reads them (the perf tier's partial-hit fault)."""
        assert self.pool is not None
        if len(os.listdir(self.pool)) <= capacity:  # nothing to evict: no file stat'ed
            return
        aged = []
        for path in self.pool.iterdir():
            try:  # the other stub may evict the same file first
                aged.append((path.stat().st_mtime_ns, path.name, path))
            except FileNotFoundError:
                continue
        aged.sort()
        for _, _, old in aged[:max(len(aged) - capacity, 0)]:
            try:
                old.unlink()
                self.evicted += 1
            except FileNotFoundError:  # the other stub evicted it first
                continue

    def audit_keys(self, salt: str, tokens: list[str], block: int, chunks: int
                   ) -> list[str]:
        """The audit hook's key of each of the first CHUNKS chunks (salt and token ids up to
        the chunk's end; a stub token's id is a hash of its word). The request's own salt,
        as the hook in a real engine keys it, also under ``--ignore-salt``: a salt-blind
        pool's loads then carry a salt that never stored them, as a real one's would."""
        ids = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little",
                              signed=True) for t in tokens]
        return chunk_keys(salt, ids, block, 0, chunks)

    def audit_records(self, request_id: str, keys: list[str], block: int,
                      stored: list[int], loaded: range, zeroed: list[int],
                      effect: _Effect | None = None, stale: frozenset[int] = frozenset()
                      ) -> None:
        """kv_audit_hook's store and load records for this request's pool traffic (KEYS:
        ``audit_keys``; EFFECT: what a server hook's stand-in changed in B's loads; STALE:
        in the hosts topology, blocks read from the L2 with other bytes than were stored)."""
        if self.audit is None or not (stored or loaded):
            return
        started = time.perf_counter()
        effect = effect or _Effect()

        def record(kind: str, chunk: int, data: bytes) -> dict[str, Any]:
            return {"kind": kind, "request": request_id, "chunk": chunk, "key": keys[chunk],
                    "group": 0, "layer": "stub", "recurrent": chunk in effect.recurrent,
                    "digest": hashlib.blake2b(data, digest_size=16).hexdigest()}

        records = [record("store", c, _kv(keys[c])) for c in stored]
        for c in loaded:
            data = bytes(128) if c in zeroed else effect.loads.get(c, _kv(keys[c]))
            if c in stale:  # the hosts topology: read from the L2 with other bytes
                data = hashlib.sha256(data + b"changed in L2").digest() * 4
            if self.stale_pool:
                data = hashlib.sha256(data + b"stale").digest() * 4
            records.append(record("load", c, data))
        if self.args.state_loads and loaded:  # a hybrid resumes from the last chunk's state
            records.append(state_load(request_id, keys, max(loaded), self.args.state_loads))
        records += [{"kind": "cost", "direction": d, "request": request_id,
                     "tokens": n * block, "seconds": time.perf_counter() - started}
                    for d, n in (("store", len(stored)), ("load", len(loaded))) if n]
        self.audit.write(records)


def state_load(request_id: str, keys: list[str], chunk: int, mode: str) -> dict[str, Any]:
    """B's recurrent-state load record for CHUNK: what a hybrid resumes from, in the audit
    hook's format with the state summary the oracle reads; MODE exact, zeroed or stale."""
    from pytest_sharedkv.engine_hooks.state_summary import (
        STUB_LAYER,
        STUB_VALUES,
        stub_state,
        summary_of,
    )

    values = (stub_state(keys[chunk]) if mode == "exact" else
              stub_state(keys[chunk - 1]) if mode == "stale" and chunk > 0
              else [0.0] * STUB_VALUES)
    return {"kind": "load", "request": request_id, "chunk": chunk, "key": keys[chunk],
            "group": 1, "layer": STUB_LAYER, "recurrent": True,
            "digest": hashlib.blake2b(repr(values).encode(), digest_size=16).hexdigest(),
            "state": summary_of(values)}


def block_bytes(key: str) -> bytes:
    """A stub block's "bytes" (what it stores and the audit digests): a function of its key."""
    return hashlib.sha256(key.encode()).digest() * 4


L2_ENTRY_REPEAT = 128  # 16 KiB an L2 entry


def _writer(path: Path) -> str:
    """The identity that stored a pool block (--identity; "" for none, or one gone)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def l2_entry(key: str) -> bytes:
    """What the stub writes to the L2 for a block: its bytes, repeated to 16 KiB, so that a
    Redis at its memory limit is filled by entries, as by LMCache's objects, and not by the
    buffers of the connections of the moment (some 40 KiB each)."""
    return block_bytes(key) * L2_ENTRY_REPEAT


def _l2_of(text: str | None) -> tuple[Any, tuple[int, ...]]:
    """The L2 an --l2-adapter JSON names (stack.l2.backends' classes) and its fault_inject gaps."""
    if not text:
        return None, ()
    from pytest_sharedkv.stack.l2.backends import parse_adapter

    return parse_adapter(json.loads(text))


def _entry(salt: str, key: str, l2: Any) -> str:
    """KEY's L2 entry, named as LMCache names one (model@kv_rank@group@hash@salt)."""
    from pytest_sharedkv.stack.l2.backends import FILE_SUFFIX, DirectoryL2

    name = f"stub@0x00000000@0@{key[:32]}" + (f"@{salt}" if salt else "")
    return name + FILE_SUFFIX if isinstance(l2, DirectoryL2) else name


_kv = block_bytes  # a catalogue stand-in's name for it


STUB_OBJECT = 128  # the bytes of one stub chunk's "memory object" (_kv's length)
FALLBACK = "lmcache.v1.platform.torch_ops.mem_kernels:lmcache_memcpy_async"


@dataclass
class _Effect:
    """What a server hook's stand-in did to one request: chunks the answer cannot use, an
    answer one word off (stale recurrent state), the bytes B loads instead for some chunks
    and which of those are recurrent state."""

    hidden: list[int] = field(default_factory=list)
    shifted: bool = False
    loads: dict[int, bytes] = field(default_factory=dict)
    recurrent: set[int] = field(default_factory=set)


class _Unplaced(Exception):
    """A selected request where the class has nowhere to go; the message says why."""


def _placement(chunk: int, read: bool = True, recurrent: bool = False, **extra: Any
               ) -> dict[str, Any]:
    """A placement as the fault hook logs one (the stub's chunk is one layer, "stub")."""
    return {"chunk": chunk, "layer": "stub", "layer_index": 0,
            "region": "recurrent" if recurrent else "attention", "plane": None,
            "block": chunk, "start": 0, "stop": STUB_OBJECT, "read": read, **extra}


def _middle(chunks: list[int]) -> list[int]:
    """The chunks before the last (the last one's recurrent state is what an engine reads)."""
    return [c for c in chunks if c < chunks[-1]] if chunks else []


def _pick(chunks: list[int], what: str) -> int:
    if not chunks:
        raise _Unplaced(f"no {what}")
    return chunks[len(chunks) // 2]


class _Hooks:
    """The stand-ins of the LMCache server's hooks in a stub (the catalogue's fault hook,
    the triage's stream remedy, the delay hook): the same control file, the same log
    lines, and each fault's effect on what the stub answers and digests."""

    def __init__(self, args: argparse.Namespace) -> None:
        if args.no_hooks:  # as a server whose hooks never loaded: the switches do nothing
            args = argparse.Namespace(**{**vars(args), "fault_control": None,
                                         "stream_remedy": None, "inject_log": None})
        self.args = args
        self.lock = threading.Lock()
        self.donors: dict[str, dict[str, bytes]] = {}  # request -> "mid"/"last" -> bytes
        self.remedy_log = args.stream_remedy_log if args.stream_remedy else None
        if args.fault_control is not None:
            self.fault_line({"kind": "armed", "control": str(args.fault_control)})
            self.fault_line({"kind": "wrapped", "target": "stub_openai:pool"})
        if self.remedy_log:
            self.remedy_line({"kind": "armed", "remedy": args.stream_remedy,
                              "places": [FALLBACK]})
            self.remedy_line({"kind": "wrapped", "target": FALLBACK,
                              "remedy": args.stream_remedy})

    @staticmethod
    def _append(path: str | Path | None, line: str) -> None:
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(line)

    def fault_line(self, record: dict[str, Any]) -> None:
        self._append(self.args.fault_log,
                     json.dumps({"pid": os.getpid(), **record}, sort_keys=True) + "\n")

    def remedy_line(self, record: dict[str, Any]) -> None:
        self._append(self.remedy_log,
                     json.dumps({"pid": os.getpid(), **record}, sort_keys=True) + "\n")

    def transfers(self, stored: list[int], loaded: range, block: int) -> None:
        """The delay hook's and the remedy's lines for this request's pool transfers."""
        for direction, chunks in (("D2H", len(stored)), ("H2D", len(loaded))):
            if not chunks:
                continue
            self._append(self.args.inject_log, f"{os.getpid()}\tserver\tstub:{direction}\n")
            if self.remedy_log:
                self.remedy_line({"kind": "applied", "remedy": self.args.stream_remedy,
                                  "target": FALLBACK, "direction": direction,
                                  "bytes": chunks * block * STUB_TOKEN_BYTES, "pieces": 1})

    def control(self) -> Any:
        """The catalogue's control now (fault_hook.Control), or None."""
        from pytest_sharedkv.engine_hooks.fault_hook import ControlError, parse_control

        path = self.args.fault_control
        if path is None or not path.exists():
            return None
        try:
            return parse_control(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, ControlError) as exc:
            self.fault_line({"kind": "error", "why": f"control file {path}: {exc}"})
            return None

    def apply(self, request: str, pre: _Prefill, keys: list[str], pool: Path | None
              ) -> _Effect:
        """The catalogue class the control names, applied to this request's store or load
        (logged as the fault hook logs it), and what a lost write left in the pool."""
        effect = _Effect()
        if self.args.fault_control is None:
            return effect
        loaded = list(pre.loaded)
        for chunk in loaded:  # a store that never landed: its committed key serves old bytes
            if pool is not None and (pool / f"{pre.keys[chunk]}.lost").exists():
                effect.loads[chunk] = b"never stored" * 8
                effect.hidden.append(chunk)
        control = self.control()
        if control is None:
            return effect
        from pytest_sharedkv.engine_hooks.fault_classes import fault_class

        store = fault_class(control.fault).direction == "store"
        chunks = pre.stored if store else loaded
        if not chunks:
            return effect
        chosen = control.selects(request)
        with self.lock:
            if not chosen and not store:
                self.remember(request, loaded, keys)
        if not chosen:
            return effect
        base = {"class": control.fault, "cell": control.cell, "request": request,
                "op": f"{request}#1", "direction": "D2H" if store else "H2D",
                "object_group": 0}
        try:
            extra = self.place(control, request, chunks, keys, pre, pool, effect)
        except _Unplaced as why:
            self.fault_line({**base, "kind": "unplaced", "why": str(why)})
            return effect
        self.fault_line({**base, "kind": "applied", **extra})
        return effect

    def remember(self, request: str, loaded: list[int], keys: list[str]) -> None:
        """Another request's middle and last chunk, for a collision or foreign state."""
        middle = _middle(loaded)
        chunks = {"last": _kv(keys[loaded[-1]])}
        if middle:
            chunks["mid"] = _kv(keys[middle[len(middle) // 2]])
        self.donors[request] = chunks
        while len(self.donors) > 4:
            self.donors.pop(next(iter(self.donors)))

    def donor(self, request: str, role: str) -> tuple[str, bytes]:
        with self.lock:
            for other, chunks in reversed(list(self.donors.items())):
                if other != request and role in chunks:
                    return other, chunks[role]
        raise _Unplaced(f"no other request's {role} chunk of {STUB_OBJECT} bytes seen yet")

    def place(self, control: Any, request: str, chunks: list[int], keys: list[str],
              pre: _Prefill, pool: Path | None, effect: _Effect) -> dict[str, Any]:
        """Where the class goes in this request and what it does; the log line's fields."""
        name, middle, last = control.fault, _middle(chunks), chunks[-1]
        if name == "misrouted":
            a = _pick([c for c in middle if c + 1 in middle],
                      f"two adjacent chunks before the last ({len(chunks)} chunks)")
            effect.loads.update({a: _kv(keys[a + 1]), a + 1: _kv(keys[a])})
            return {"swapped": [a, a + 1],
                    "placements": [_placement(a, holds=a + 1), _placement(a + 1, holds=a)]}
        if name == "key-collision":
            target = _pick(middle, f"chunk before the last ({len(chunks)} chunks)")
            other, data = self.donor(request, "mid")
            effect.loads[target] = data
            effect.hidden.append(target)
            return {"chunk": target, "donor": {"request": other},
                    "placements": [_placement(target)]}
        if name == "lost-write":
            target = _pick(middle, f"stored chunk before the last ({len(chunks)} chunks)")
            if pool is not None:
                (pool / f"{pre.keys[target]}.lost").touch()
            return {"chunk": target, "placements": [_placement(target)]}
        if name in ("bit-flip", "bit-flip-unread"):
            target = _pick(middle or chunks, f"chunk ({len(chunks)} chunks)")
            read = name == "bit-flip"
            byte = STUB_OBJECT // 2 - 1
            if read:
                flipped = bytearray(_kv(keys[target]))
                flipped[byte] ^= 1 << control.bit
                effect.loads[target] = bytes(flipped)
            return {"chunk": target, "byte": byte, "bit": control.bit,
                    "placements": [_placement(target, read=read, recurrent=not read,
                                              byte=byte)]}
        if name in ("state-unrestored", "state-foreign"):
            if name == "state-foreign":
                other, data = self.donor(request, "last")
                extra: dict[str, Any] = {"donor": {"request": other}}
            else:
                data, extra = b"old state" * 14 + b"..", {"redirected": [{"block_id": None}]}
            effect.loads[last] = data
            effect.recurrent.add(last)
            effect.shifted = True
            return {"chunk": last, **extra, "placements": [_placement(last, recurrent=True)]}
        raise _Unplaced(f"the stub has no stand-in for {name}")


def _continuation(prompt: str, max_tokens: int) -> list[str]:
    digest = hashlib.sha256(prompt.encode()).hexdigest() * (1 + max_tokens // 16)
    return [f"tok{digest[i:i + 4]}" for i in range(0, 4 * max_tokens, 4)]


def _zeroed(control: Path | None) -> list[int]:
    if control is None:
        return []
    from pytest_sharedkv.engine_hooks.corrupt_hook import chunks_to_zero

    return chunks_to_zero(control)


def _zeroed_in_retrieve(state: _State, block: int, local: int, external: int
                        ) -> list[int]:
    """The chunks the gate zeroes in this request's pool hit (logged, as the hook does)."""
    from pytest_sharedkv.engine_hooks.corrupt_hook import log_zeroed

    chunks = [c for c in _zeroed(state.args.corrupt_control) if external
              and local <= c * block < local + external]
    for chunk in chunks:
        log_zeroed(state.args.corrupt_log, 0, chunk, 0)
    return chunks


def _copy_answer(words: list[str], max_tokens: int, zeroed: list[int], block: int,
                 diverge: bool) -> list[str]:
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, ids_of, vocabulary
    from pytest_sharedkv.models.copy_rule import continue_ids

    recipe = CopyModelRecipe()
    vocab = vocabulary(recipe)
    miss = vocab.index("\u2581<miss>")
    ids = [0, *(i if i >= 0 else miss for i in ids_of(" ".join(words), recipe))]
    hidden = {t for chunk in zeroed for t in range(chunk * block, (chunk + 1) * block)}
    answer = continue_ids(ids, max_tokens, miss, hidden)
    if diverge:
        answer = [answer[-1], *answer[:-1]]
    return [vocab[i].removeprefix("\u2581") for i in answer]


@dataclass(frozen=True)
class _Prefill:
    """What the stub's cache made of one prompt: its tokens (``<s>`` first for copy prompts),
    the hit granularity, the hits, the blocks this prompt put in the pool, and which
    completion this is (1-based)."""

    words: list[str]
    tokens: list[str]
    copy: bool
    block: int
    local: int
    external: int
    stored: list[int]
    done: int
    server: _ServerLookup | None = None  # the hosts topology's server lookup
    keys: tuple[str, ...] = ()  # every whole block's pool key, in order
    foreign: bool = False  # it loaded KV another identity stored (--identity)

    @property
    def cached(self) -> int:
        return self.local + self.external

    @property
    def loaded(self) -> range:
        """The chunks this prompt took from the pool."""
        return range(self.local // self.block, (self.local + self.external) // self.block)


def _prefill(state: _State, prompt: str, salt: str) -> _Prefill:
    """Look PROMPT up in the stub's cache and pool and count it in the engine counters
    /metrics reports: copy prompts count ``<s>`` and hit one token short, as vLLM's do."""
    words = prompt.split()
    copy = len(words) > 5 and all(COPY_WORD.match(w) for w in words)
    tokens = ["<s>", *words] if copy else words
    with state.lock:
        limit = len(tokens) - 1 if copy else len(tokens)
        block = state.args.block if copy else BLOCK
        local, external, stored, keys = state.lookup(salt, tokens, block, limit)
        server = state.last if state.l2 is not None else None
        foreign = state.foreign
        state.queries += len(tokens)
        state.hits += local
        state.external_hits += external
        state.completions += 1
        done = state.completions
    if state.args.offload_log and (stored or external):
        moved = [f"vllm:kv_offload_store_bytes={len(stored) * block * STUB_TOKEN_BYTES}"]
        if external:
            moved.append(f"vllm:kv_offload_load_bytes={external * STUB_TOKEN_BYTES}")
        print(f"[{state.name}] KV Transfer metrics: {', '.join(moved)}", flush=True)
    return _Prefill(words, tokens, copy, block, local, external, stored, done, server=server,
                    keys=keys, foreign=foreign)


def _answer_words(state: _State, prompt: str, max_tokens: int, pre: _Prefill,
                  zeroed: list[int], effect: _Effect | None = None) -> list[str]:
    """The continuation, with the faults asked for: copy prompts by the copy rule (the
    gate's ZEROED chunks and a hook stand-in's hidden ones hidden, one word off under
    --diverge or stale state), others a hash of the prompt; any pool hit under
    --corrupt-external (or a planted race) answers as if from stale KV."""
    effect = effect or _Effect()
    if pre.copy:
        edge = (state.args.boundary_diverge and pre.external > 0
                and len(pre.tokens) % pre.block == 0)  # vLLM #51094's condition, planted
        out = _copy_answer(pre.words, max_tokens, [*zeroed, *effect.hidden], pre.block,
                           state.args.diverge or effect.shifted or edge)
    else:
        out = _continuation(prompt, max_tokens)
    stale = (pre.server is not None and bool(pre.server.stale)) or pre.foreign
    if pre.external and (state.stale_pool or stale):
        out = _continuation(prompt + " stale", max_tokens)
    return out


def _apply_stop(out: list[str], stops: list[str]) -> tuple[list[str], str]:
    """(the words before the first stop string, finish_reason), as an engine stops."""
    for stop in stops:
        text_so_far = ""
        for i, word in enumerate(out):
            text_so_far += " " + word
            if stop in text_so_far:
                return out[:i], "stop"
    return out, "length"


def _chain(salt: str, tokens: list[str], block: int, limit: int) -> list[tuple[int, str]]:
    """(end, key) of each whole block of the first LIMIT tokens: a prefix hash chain from
    SALT, block by block."""
    keys, chain = [], hashlib.sha256(salt.encode()).hexdigest()
    for end in range(block, limit + 1, block):
        chain = hashlib.sha256(f"{chain}|{' '.join(tokens[end - block:end])}".encode()
                               ).hexdigest()
        keys.append((end, chain))
    return keys


def _usage(pre: _Prefill, out: list[str], engine: str = "vllm") -> dict[str, Any]:
    """vLLM's usage (--enable-prompt-tokens-details: cached tokens always there), or
    SGLang 0.5.17's (--enable-cache-report: prompt_tokens_details left out when nothing
    was cached, UsageProcessor._details_if_cached)."""
    usage: dict[str, Any] = {"prompt_tokens": len(pre.tokens), "completion_tokens": len(out),
                             "total_tokens": len(pre.tokens) + len(out)}
    if engine != SGLANG or pre.cached > 0:
        usage["prompt_tokens_details"] = {"cached_tokens": pre.cached}
    return usage


def _choice(request: dict[str, Any], out: list[str], finish: str, copy: bool
            ) -> dict[str, Any]:
    """The answer's choice: text, and logprobs / vLLM's token_ids when REQUEST asks."""
    choice: dict[str, Any] = {"index": 0, "text": "".join(" " + w for w in out),
                              "finish_reason": finish}
    if request.get("logprobs") is not None:
        choice["logprobs"] = {
            "tokens": [" " + w for w in out], "token_logprobs": [0.0] * len(out),
            "top_logprobs": [{" " + w: 0.0} for w in out],
            "text_offset": [4 * i for i in range(len(out))]}
    if request.get("return_token_ids") and copy:
        from pytest_sharedkv.models.copy_model import CopyModelRecipe, ids_of

        choice["token_ids"] = ids_of(" ".join(out), CopyModelRecipe())
    return choice


def _metrics_text(state: _State) -> str:
    """The prefix-cache counters the suite reads, in Prometheus text: vLLM's, or SGLang
    0.5.17's (--enable-metrics: sglang:cached_tokens_total by cache_source, device the
    radix cache's own hits, host what its LMCache radix cache loaded)."""
    if state.args.engine == SGLANG:
        return ("# HELP sglang:cached_tokens_total Number of cached prompt tokens by source.\n"
                "# TYPE sglang:cached_tokens_total counter\n"
                f'sglang:cached_tokens_total{{cache_source="device"}} {state.hits}\n'
                f'sglang:cached_tokens_total{{cache_source="host"}} {state.external_hits}\n')
    return (f"vllm:prefix_cache_queries_total {state.queries}\n"
            f"vllm:prefix_cache_hits_total {state.hits}\n"
            f"vllm:external_prefix_cache_hits_total {state.external_hits}\n")


def _server_metrics_text(state: _State) -> str:
    """LMCache's L1 counters (lmcache_mp_l1_*_chunks_total) of this stub's server."""
    with state.lock:
        written, evicted = state.l1_writes, state.evicted
    return (f'lmcache_mp_l1_write_chunks_total{{l1_tag="_default"}} {written}\n'
            f'lmcache_mp_l1_evicted_chunks_total{{l1_tag="_default"}} {evicted}\n')


class _StubHandler(BaseHTTPRequestHandler):
    """The stub's HTTP side: routing, headers and the completion answer; make_handler
    binds it to one server's state."""

    stub: ClassVar[_State]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        print(f"[{self.stub.name}] {self.command} {self.path}", flush=True)

    def _headers(self, code: int, content_type: str, length: int | None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Connection", "close")
        self.send_header("X-Sharedkv-Test-Double", "1")
        self.end_headers()

    def _send(self, code: int, body: object, content_type: str = "application/json"
              ) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self._headers(code, content_type, len(data))
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._health()
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        elif self.path == "/metrics":
            self._metrics()
        elif self.path == "/server/metrics":  # its LMCache server's half: L1 counters
            self._send(200, _server_metrics_text(self.stub), "text/plain")
        else:
            self._send(404, {"error": "not found"})

    def _health(self) -> None:
        never = self.stub.args.never_ready  # a replica that never becomes ready
        self._send(503 if never else 200, {"ok": not never})

    def _metrics(self) -> None:
        with self.stub.lock:
            self.stub.scrapes += 1
            scrape = self.stub.scrapes
        if scrape in self.stub.args.fail_metrics:  # a failed Prometheus scrape, on purpose
            self._send(503, {"error": f"scrape {scrape} fails on purpose"})
            return
        self._send(200, _metrics_text(self.stub), "text/plain")

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            self._send(404, {"error": "not found"})
            return
        length = int(self.headers.get("Content-Length", "0"))
        request: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        done = self._completion(request)
        if done is not None:
            self._crash_if_due(done)

    def _completion(self, request: dict[str, Any]) -> int | None:
        """Answer one completion; which completion it was, or None if refused."""
        prompt = str(request.get("prompt", ""))
        salt = str(request.get("cache_salt", ""))
        if "/" in salt:  # as LMCache 0.5.6's IPCCacheServerKey refuses it
            self._send(400, {"error": {"message": f"cache_salt must not contain '/' "
                                                  f"(got {salt!r})", "code": 400}})
            return None
        max_tokens = int(request.get("max_tokens", 16))
        twin = self.stub.twin_enter(salt, prompt) if self.stub.args.twins_diverge else 0
        left = not self.stub.args.twins_diverge

        def leave() -> None:  # out of flight before the answer is sent: a client that sends
            nonlocal left  # its next request on the answer never finds this one in flight
            if not left:
                left = True
                self.stub.twin_leave(salt, prompt)

        try:
            return self._answer(request, prompt, salt, max_tokens, twin, leave)
        finally:
            leave()

    def _answer(self, request: dict[str, Any], prompt: str, salt: str, max_tokens: int,
                twin: int, leave: Callable[[], None]) -> int:
        """The completion's answer; TWIN: identical requests in flight ahead of it under
        --twins-diverge (0: none, answered as constructed); LEAVE: called before it is
        sent."""
        pre = _prefill(self.stub, prompt, salt)
        if self.stub.args.prefill_us:
            time.sleep(self.stub.args.prefill_us * 1e-6 * (len(pre.tokens) - pre.cached))
        zeroed = (_zeroed_in_retrieve(self.stub, pre.block, pre.local, pre.external)
                  if pre.copy else [])
        request_id = self.headers.get("X-Request-Id") or f"cmpl-stub-{pre.done}"
        if pre.server is not None and pre.server.split[0]:  # as LMCache logs a lookup that hit
            from pytest_sharedkv.stack.l2.log import retained_line

            engine_id = (f"cmpl-{request_id}-0-"
                         f"{hashlib.sha256(request_id.encode()).hexdigest()[:8]}")
            print(f"[{self.stub.name}] " + retained_line(*pre.server.split, engine_id,
                                                         pre.done), flush=True)
        chunks = max([*pre.stored, *pre.loaded], default=-1) + 1
        keys = self.stub.audit_keys(salt, pre.tokens, pre.block, chunks)
        hooks = self.stub.hooks
        hooks.transfers(pre.stored, pre.loaded, pre.block)
        effect = hooks.apply(request_id, pre, keys, self.stub.pool) if pre.copy else None
        self.stub.audit_records(request_id, keys, pre.block, pre.stored, pre.loaded, zeroed,
                                effect,
                                pre.server.stale if pre.server is not None else frozenset())
        words = _answer_words(self.stub, prompt, max_tokens, pre, zeroed, effect)
        if twin:  # the planted fault: the twin's own answer
            words = _continuation(f"{prompt} twin {twin}", max_tokens)
        if self.stub.args.sequence_diverge and pre.external:  # the planted fault: each load
            with self.stub.lock:  # of this prompt from the pool answers one of its own
                served = self.stub.pool_served.get((salt, prompt), 0) + 1
                self.stub.pool_served[(salt, prompt)] = served
            words = _continuation(f"{prompt} pool load {served}", max_tokens)
        out, finish = _apply_stop(words, request.get("stop") or [])
        usage = _usage(pre, out, self.stub.args.engine)
        choice = _choice(request, out, finish, pre.copy)
        leave()
        if request.get("stream"):
            self._stream(pre.done, out, choice, usage, request)
        else:
            self._send(200, {"id": f"cmpl-{pre.done}", "object": "text_completion",
                             "model": "stub", "choices": [choice], "usage": usage})
        return pre.done

    def _crash_if_due(self, done: int) -> None:
        if self.stub.args.crash_after is not None and done >= self.stub.args.crash_after:
            print(f"[{self.stub.name}] crashing on purpose after {done} completions",
                  flush=True)
            os._exit(3)

    def _stream(self, done: int, out: list[str], choice: dict[str, Any],
                usage: dict[str, Any], request: dict[str, Any]) -> None:
        self._headers(200, "text/event-stream", None)
        base = {"id": f"cmpl-{done}", "object": "text_completion", "model": "stub"}
        for i, word in enumerate(out):
            last = i == len(out) - 1
            part = {**base, "choices": [{"index": 0, "text": " " + word,
                                         "finish_reason": choice["finish_reason"]
                                         if last else None}]}
            self.wfile.write(f"data: {json.dumps(part)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.001)
        if (request.get("stream_options") or {}).get("include_usage"):
            tail = {**base, "choices": [], "usage": usage}
            self.wfile.write(f"data: {json.dumps(tail)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def make_handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(_StubHandler):
        stub = state

    return Handler


class _Server(ThreadingHTTPServer):
    # the default backlog of 5 drops a burst of connections (a client's SYN is then
    # retried a second later): the perf tier opens 8 sessions at once
    request_queue_size = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="stub")
    parser.add_argument("--engine", choices=("vllm", SGLANG), default="vllm",
                        help="answer usage and /metrics as this engine does")
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--pool", type=Path, default=None)
    parser.add_argument("--block", type=int, default=32,
                        help="hit granularity of copy-model prompts (tokens)")
    parser.add_argument("--prefill-us", type=float, default=0.0,
                        help="simulated prefill: microseconds per uncached prompt token")
    parser.add_argument("--pool-blocks", type=int, default=None,
                        help="keep at most this many blocks in the pool (oldest out)")
    parser.add_argument("--corrupt-external", action="store_true")
    parser.add_argument("--ignore-salt", action="store_true")
    parser.add_argument("--identity", default="",
                        help="the model identity (weights, RoPE scaling, kv-cache dtype, "
                        "adapter) its keys fold in; a block another identity stored answers "
                        "as stale KV")
    parser.add_argument("--identity-blind", action="store_true",
                        help="a planted fault: keys leave --identity out")
    parser.add_argument("--pool-ignores-salt", action="store_true",
                        help="the pool's keys without the cache_salt, the engine's own cache "
                             "with it (SGLang #37160's LMCache path)")
    parser.add_argument("--diverge", action="store_true")
    parser.add_argument("--corrupt-control", type=Path, default=None)
    parser.add_argument("--corrupt-log", default=None)
    parser.add_argument("--fail-metrics", type=lambda t: {int(n) for n in t.split(",") if n},
                        default=set(), metavar="N,M",
                        help="answer these GET /metrics (1-based) with HTTP 503")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="its own cache serves nothing: every hit from the pool")
    parser.add_argument("--twins-diverge", action="store_true",
                        help="identical requests in flight together answer differently")
    parser.add_argument("--sequence-diverge", action="store_true",
                        help="each load of a prompt from the pool answers differently")
    parser.add_argument("--boundary-diverge", action="store_true",
                        help="a whole-block copy prompt loaded from the pool answers wrong")
    parser.add_argument("--gpu-blocks", type=int, default=None,
                        help="keep at most N blocks in its own cache, LRU (native offload)")
    parser.add_argument("--gpu-kv-tokens", type=int, default=None,
                        help="the GPU KV cache size to log at start, in tokens (default: "
                             "--gpu-blocks of --block tokens; neither: no line)")
    parser.add_argument("--offload-log", action="store_true",
                        help="log pool traffic as vLLM's offloading connector does")
    parser.add_argument("--state-loads", choices=("exact", "zeroed", "stale"), default=None,
                        help="report a recurrent-state load for the last chunk B loads")
    parser.add_argument("--kv-audit", type=Path, default=None,
                        help="write kv_audit_hook's digest records into this directory")
    parser.add_argument("--l2-adapter", default=None,
                        help="the hosts topology: the L2 the stubs share (LMCache's JSON)")
    parser.add_argument("--l2-flip-chunk", type=int, default=None,
                        help="flip a byte of this chunk's L2 entry once it is written")
    parser.add_argument("--l2-unattached", action="store_true",
                        help="log the connector's error instead of the L2 attach line")
    parser.add_argument("--fault-control", type=Path, default=None,
                        help="the fault catalogue's control file (fault_hook's format)")
    parser.add_argument("--fault-log", default=None,
                        help="fault_hook's log lines, for the classes the control names")
    parser.add_argument("--stream-remedy", default=None,
                        help="log a stream remedy's lines (stream_remedy_hook's format)")
    parser.add_argument("--stream-remedy-log", default=None)
    parser.add_argument("--inject-log", default=None,
                        help="log each pool transfer as the delay hook does in the server")
    parser.add_argument("--race-unless-remedy", default=None, metavar="REMEDY",
                        help="B's pool hits answer as from stale KV unless this remedy is on")
    parser.add_argument("--no-hooks", action="store_true",
                        help="the server hooks' stand-ins never load (their flags do nothing)")
    parser.add_argument("--race-under-delay", action="store_true",
                        help="B's pool hits answer as from stale KV while the delay is on")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.corrupt_control is not None and args.corrupt_log:  # as the server's hook does
        from pytest_sharedkv.engine_hooks.corrupt_hook import log_armed

        log_armed(args.corrupt_log)
    if args.pool is not None:
        args.pool.mkdir(parents=True, exist_ok=True)
    if args.l2_adapter:  # what an LMCache server logs of its L2 (l2_log reads it)
        from pytest_sharedkv.stack.l2.log import CONNECTOR_ERROR, attach_lines

        for line in ([f"{CONNECTOR_ERROR} connection failed"] if args.l2_unattached
                     else attach_lines(json.loads(args.l2_adapter))):
            print(f"LMCache INFO: {line}" if not line.startswith(CONNECTOR_ERROR) else line,
                  flush=True)
    said = args.gpu_kv_tokens if args.gpu_kv_tokens is not None else (
        args.gpu_blocks * args.block if args.gpu_blocks is not None else None)
    if said is not None:  # as vLLM 0.26.0's kv_cache_utils logs it (engine_start reads it)
        print(f"[{args.name}] INFO [kv_cache_utils.py] GPU KV cache size: {said:,} tokens",
              flush=True)
    server = _Server(("127.0.0.1", args.port), make_handler(_State(args)))
    print(f"[{args.name}] TEST DOUBLE serving on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
