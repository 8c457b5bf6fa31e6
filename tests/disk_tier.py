"""LMCache #4385 at LMCache's storage layer, on CPU: sessions whose KV the CPU tier
(``local_cpu``) no longer holds come back from the disk tier (``local_disk``) byte for byte
their own.

LMCache's own engine runs here, in this process: ``LMCacheEngineBuilder`` builds it from
the YAML the in-process connector writes for a replica (``inprocess_connector``), and its
``store``, ``lookup`` (pinned, as the connector's lookup server asks) and ``retrieve``
decide, through its ``StorageManager``, ``LocalCPUBackend`` and ``LocalDiskBackend``,
where each chunk lives. In place of vLLM's paged GPU connector (LMCache builds none for a
CPU device, and its ``MockGPUConnector`` moves no bytes) a CPU connector of the suite's
copies a session's KV slice into each memory object and back out. Not vLLM, not the
connector's scheduler side (its lookup server and vLLM's hash): the storage path of the
LMCache that imports (the outcome names its version; 0.5.6 in the venv, not 0.5.2).

Each session stores its KV over several turns, each turn extending its own earlier prompt
as a multi-turn session does: the turn first loads its prefix back (lookup, retrieve) and
then stores its new chunks (the store masks the chunks already stored, as the connector
does), every turn's disk writes finished (polled, bounded) before the next, in a CPU tier
smaller than all sessions' KV: the earliest sessions survive only on disk. Then every
session returns, is looked up and retrieved. Every chunk retrieved, on a turn's load or on
the return, is compared with what the session stored; a wrong chunk whose bytes are
another session's chunk names it. No chunk served from disk is VOID.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.stack.launch.inprocess_connector import (
    REPLICA_ENV,
    InprocessSettings,
    inprocess_launch,
)

if TYPE_CHECKING:
    import torch

CHUNK = 256  # tokens a chunk: the chunk the suite's in-process configuration runs
LAYERS, KV_HEADS, HEAD_SIZE = 2, 2, 64  # one chunk: 2 x 2 x 256 x 128 x 2 B = 256 KiB
CHUNK_BYTES = 2 * LAYERS * CHUNK * KV_HEADS * HEAD_SIZE * 2  # bfloat16
GIB = 1 << 30
REPLICA = "A"  # the configuration file of replica A, as the connector's launch writes it
PLANT = ("none", "swap")  # swap: two chunks' files exchanged on disk (the control)


@dataclass(frozen=True)
class SessionSeen:
    """One visit of a session (VISIT: "turn N", the load of its prefix before it stores
    turn N, or "return"): the chunks it had stored up to then (CHUNKS), those LMCache held
    on either tier when it came (STORED), those the CPU tier no longer held (so served
    from disk), those LMCache's pinned lookup placed on the disk tier (DISK_SERVED: the
    storage manager walks the tiers in order, each by prefix, so a chunk the CPU tier
    holds behind one it does not is served from disk too), chunks retrieved, chunks wrong;
    for a wrong chunk whose bytes are another session's chunk, which one (chunk index ->
    "session S chunk C"; "unknown" where none)."""

    session: int
    visit: str
    chunks: int
    stored: int
    from_disk: int
    disk_served: int
    missing: int  # held by neither tier when it returned: a miss, never wrong
    retrieved: int
    wrong: int
    donors: dict[int, str] = field(default_factory=dict)


@dataclass
class DiskPagingOutcome:
    """What the check saw: per session visit (``sessions``; the returns are the visits
    named "return"), the LMCache lines at WARNING or above (``errors``: those at ERROR),
    the planted fault, the problems; VOID where nothing came from disk."""

    sessions: list[SessionSeen] = field(default_factory=list)
    cpu_capacity_chunks: int = 0
    lmcache: str | None = None  # the version of the package that ran (its _version.py)
    logged: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    planted: str | None = None
    problems: list[str] = field(default_factory=list)
    void: str | None = None

    def totals(self, visit: str | None = None) -> dict[str, int]:
        """Sums over the visits (VISIT: only those, e.g. "return")."""
        keys = ("chunks", "stored", "from_disk", "disk_served", "missing", "retrieved",
                "wrong")
        seen = [s for s in self.sessions if visit is None or s.visit == visit]
        return {k: sum(getattr(s, k) for s in seen) for k in keys}

    def returns(self) -> list[SessionSeen]:
        return [s for s in self.sessions if s.visit == "return"]

    def verdict(self) -> tuple[str, str]:
        """(kind, status): a wrong byte fails (kind bytes); then a problem (kind disk);
        then VOID; else a pass."""
        if any(s.wrong for s in self.sessions):
            return "bytes", "fail"
        if self.problems:
            return "disk", "fail"
        if self.void:
            return "void", "void"
        return "disk-paging", "pass"

    def as_dict(self) -> dict[str, Any]:
        kind, status = self.verdict()
        return {"kind": kind, "status": status, "lmcache": self.lmcache,
                "totals": self.totals(),
                "returns": self.totals("return"),
                "cpu_capacity_chunks": self.cpu_capacity_chunks,
                "sessions": [asdict(s) for s in self.sessions], "planted": self.planted,
                "errors": self.errors, "logged": self.logged, "problems": self.problems,
                "void": self.void}


def tier_gb(chunks: int) -> float:
    """CHUNKS of KV in GB as LMCache reads ``max_local_*_size`` (GiB)."""
    return chunks * CHUNK_BYTES / GIB


def _digest(tensor: torch.Tensor) -> str:
    import torch

    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _cpu_connector(kv_shape: tuple[int, ...]) -> Any:
    """LMCache's mock connector with the copies it leaves out: KV (``kv=``, a
    [2, layers, tokens, hidden] tensor) sliced by token into each memory object on store,
    and back out on retrieve."""
    from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector

    class CPUConnector(MockGPUConnector):  # type: ignore[misc]
        def batched_from_gpu(self, objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
            for obj, start, end in zip(objs, starts, ends, strict=True):
                obj.tensor.copy_(kw["kv"][:, :, start:end, :])

        def batched_to_gpu(self, objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
            for obj, start, end in zip(objs, starts, ends, strict=True):
                kw["kv"][:, :, start:end, :].copy_(obj.tensor)

    return CPUConnector(kv_shape)


class _Lines(logging.Handler):
    """LMCache's records at WARNING or above, as ``LEVEL file:line message``, from every
    ``lmcache`` logger it was attached to (each has its own handler and does not
    propagate, ``lmcache/logging.py`` ``init_logger``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[tuple[int, str]] = []
        self.loggers: list[logging.Logger] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, f"{record.levelname} {record.filename}:"
                           f"{record.lineno} {record.getMessage()}"))

    def attach(self) -> None:
        """On every ``lmcache`` logger made so far (called again after imports)."""
        for name in list(logging.root.manager.loggerDict):
            found = logging.getLogger(name)
            if ((name == "lmcache" or name.startswith("lmcache."))
                    and found not in self.loggers):
                found.addHandler(self)
                self.loggers.append(found)

    def detach(self) -> None:
        for each in self.loggers:
            each.removeHandler(self)
        self.loggers.clear()


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _Engine:
    """One LMCache engine built as the connector builds it (one replica's config file,
    ``LMCacheEngineBuilder.get_or_create``, ``post_init``), under an id of its own."""

    def __init__(self, config_file: Path, lines: _Lines) -> None:
        import multiprocessing

        import torch
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata

        lines.attach()
        config = LMCacheEngineConfig.from_file(str(config_file))
        config.update_config_from_env()  # as lmcache_get_or_create_config does
        metadata = LMCacheMetadata(
            model_name="sharedkv-disk-tier", world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=torch.bfloat16,
            kv_shape=(LAYERS, 2, config.chunk_size, KV_HEADS, HEAD_SIZE), role="worker",
            chunk_size=config.chunk_size)
        self.instance_id = f"sharedkv-disk-tier-{uuid.uuid4().hex[:8]}"
        self.builder = LMCacheEngineBuilder
        method = multiprocessing.get_start_method(allow_none=True)
        try:
            self.engine = LMCacheEngineBuilder.get_or_create(
                self.instance_id, config, metadata, _cpu_connector(metadata.kv_shape),
                lambda tensor, src: tensor, lambda obj, src: obj)
            self.engine.post_init()
            lines.attach()
        except BaseException:
            LMCacheEngineBuilder.destroy(self.instance_id)
            raise
        finally:  # the engine forces "spawn" process-wide (cache_engine.py, __init__)
            multiprocessing.set_start_method(method, force=True)
        backends = self.engine.storage_manager.storage_backends
        self.cpu = backends["LocalCPUBackend"]
        self.disk = backends.get("LocalDiskBackend")

    def keys(self, tokens: torch.Tensor) -> list[Any]:
        return [key for _, _, key in self.engine.token_database.process_tokens(tokens)]

    def close(self) -> None:
        self.builder.destroy(self.instance_id)


def _wait_disk(engine: _Engine, keys: list[Any], deadline_s: float) -> str | None:
    """Poll until no key of KEYS has a disk write in flight (LMCache registers each put
    before ``store`` returns and clears it after the file is written and indexed); the
    problem in words where the deadline passed first."""
    started = time.monotonic()
    while True:
        pending = sum(1 for key in keys if engine.disk.exists_in_put_tasks(key))
        if not pending:
            return None
        if time.monotonic() - started > deadline_s:
            return (f"{pending} disk write(s) still in flight {deadline_s:g}s after the "
                    "store returned")
        time.sleep(0.002)


def _swap(engine: _Engine, victim: Any, donor: Any) -> None:
    """Exchange the files of two keys in the disk tier's directory (the index keeps each
    key's own path, ``LocalDiskBackend._key_to_path``)."""
    first, second = engine.disk.dict[victim].path, engine.disk.dict[donor].path
    spare = first + ".sharedkv-swap"
    os.replace(first, spare)
    os.replace(second, first)
    os.replace(spare, second)


def check_disk_paging(workdir: Path, sessions: int = 8, turns: int = 2,
                      chunks_per_turn: int = 3, cpu_chunks: int = 24,
                      disk_chunks: int = 256, seed: int = 4385, plant: str = "none",
                      settle_each_turn: bool = True, shared_chunks: int = 0,
                      store_whole_prompt: bool = False,
                      deadline_s: float = 30.0) -> DiskPagingOutcome:
    """SESSIONS sessions of TURNS turns of CHUNKS_PER_TURN chunks each (distinct seeded
    bytes, distinct seeded tokens) through LMCache's engine with a ``local_cpu`` tier of
    CPU_CHUNKS chunks and a ``local_disk`` tier of DISK_CHUNKS under WORKDIR, as
    ``InprocessSettings`` configures replica A; then each session returns, earliest
    first, and its retrieved bytes are compared with its own. PLANT ``swap``: before the
    returns, the file of the earliest session's first chunk the CPU tier no longer holds
    is exchanged with the last session's first chunk's (the control: the check must fail
    naming the last session). SETTLE_EACH_TURN False: the disk writes are waited for
    once, after the last store, so stores meet writes in flight (a store LMCache cut short
    counts fewer chunks stored). SHARED_CHUNKS: every session's prompt and KV begin with
    the same chunks (a system prompt; one key each). STORE_WHOLE_PROMPT: each turn stores
    its whole prompt, the chunks already stored put again (concurrent requests of one
    prefix that all missed it do this)."""
    if plant not in PLANT:
        raise ValueError(f"plant must be one of {PLANT}, not {plant!r}")
    import torch
    from lmcache import _version

    outcome = DiskPagingOutcome(cpu_capacity_chunks=cpu_chunks,
                                lmcache=str(_version.__version__))
    settings = InprocessSettings(chunk_size=CHUNK, local_cpu_gb=tier_gb(cpu_chunks),
                                 local_disk=workdir / "disk",
                                 local_disk_gb=tier_gb(disk_chunks))
    launch = inprocess_launch(settings, workdir)
    launch.write()
    tokens_each = turns * chunks_per_turn * CHUNK
    generator = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(0, 32_000, (tokens_each,), generator=generator)
              for _ in range(sessions)]
    kv = [torch.randn(2, LAYERS, tokens_each, KV_HEADS * HEAD_SIZE,
                      generator=generator).to(torch.bfloat16) for _ in range(sessions)]
    shared = slice(0, shared_chunks * CHUNK)
    for s in range(1, sessions):
        tokens[s][shared] = tokens[0][shared]
        kv[s][:, :, shared, :] = kv[0][:, :, shared, :]
    chunks = turns * chunks_per_turn
    owners = {_digest(kv[s][:, :, _span(c), :]): (f"session {s} chunk {c}" if c >= shared_chunks
                                                  else f"shared chunk {c}")
              for s in range(sessions) for c in range(chunks)}
    lines = _Lines()
    env = {k: v for k, v in REPLICA_ENV.items() if k != "PYTHONHASHSEED"}
    with _environment(env):
        try:
            engine = _Engine(launch.replica(REPLICA).config_file, lines)
        except BaseException:
            lines.detach()
            raise
        try:
            if engine.disk is None:
                outcome.void = ("VOID: LMCache built no LocalDiskBackend from "
                                f"{launch.replica(REPLICA).config_file}")
            else:
                keys = [engine.keys(t) for t in tokens]
                visits = _Visits(engine, tokens, kv, keys, owners)
                outcome.problems += _store(visits, chunks_per_turn, settle_each_turn,
                                           store_whole_prompt, deadline_s)
                if plant == "swap":
                    outcome.planted = _plant_swap(engine, keys)
                for s in range(sessions):
                    visits.visit(s, "return", chunks)
                outcome.sessions = visits.seen
        finally:
            engine.close()
            lines.detach()
    outcome.logged = [text for _, text in lines.lines]
    outcome.errors = [text for level, text in lines.lines if level >= logging.ERROR]
    if outcome.void is None and outcome.planted is None and plant == "swap":
        outcome.void = "VOID: no chunk of the earliest session was on disk only to plant"
    elif outcome.void is None and not outcome.totals()["from_disk"]:
        outcome.void = ("VOID: the CPU tier still held every chunk when its session "
                        "returned: nothing came from disk, so nothing was tested")
    return outcome


def _store(visits: _Visits, chunks_per_turn: int, settle_each_turn: bool,
           whole: bool, deadline_s: float) -> list[str]:
    """Every session's turns, round by round (each session one turn a round): a turn
    after the first loads the session's prefix back (a visit), then stores the prompt so
    far with the chunks stored before masked off (the connector's ``store_mask``); the
    problems of the waits for the disk writes."""
    import torch

    engine, keys = visits.engine, visits.keys
    problems = []
    for turn in range(len(keys[0]) // chunks_per_turn):
        for s, tokens in enumerate(visits.tokens):
            done = turn * chunks_per_turn
            if turn:
                visits.visit(s, f"turn {turn}", done)
            end = (done + chunks_per_turn) * CHUNK
            mask = torch.ones(end, dtype=torch.bool)
            mask[:0 if whole else done * CHUNK] = False
            engine.engine.store(tokens[:end], mask=mask, kv=visits.kv[s],
                                req_id=f"session-{s}-turn-{turn}")
            if settle_each_turn:
                problem = _wait_disk(engine, keys[s][:end // CHUNK], deadline_s)
                if problem:
                    problems.append(f"session {s} turn {turn}: {problem}")
    problem = _wait_disk(engine, [k for each in keys for k in each], deadline_s)
    if problem:
        problems.append(f"after the last store: {problem}")
    return problems


def _plant_swap(engine: _Engine, keys: list[list[Any]]) -> str | None:
    """The control's fault in words, or None where session 0 had no chunk on disk only
    (or the last session's first chunk was not on disk)."""
    victim = next((c for c, k in enumerate(keys[0])
                   if not engine.cpu.contains(k) and engine.disk.contains(k)), None)
    last = len(keys) - 1
    if victim is None or not engine.disk.contains(keys[last][0]):
        return None
    _swap(engine, keys[0][victim], keys[last][0])
    return f"the files of session 0 chunk {victim} and session {last} chunk 0 swapped on disk"


def _span(chunk: int) -> slice:
    return slice(chunk * CHUNK, (chunk + 1) * CHUNK)


@dataclass
class _Visits:
    """The sessions' tokens, KV and chunk keys, the digests that name a chunk's owner,
    and every visit seen."""

    engine: _Engine
    tokens: list[torch.Tensor]
    kv: list[torch.Tensor]
    keys: list[list[Any]]
    owners: dict[str, str]
    seen: list[SessionSeen] = field(default_factory=list)

    def visit(self, s: int, label: str, chunks: int) -> None:
        """Session S comes with its first CHUNKS chunks: where they are, the pinned lookup,
        the retrieve into a zeroed buffer, the lookup's pins released (the connector's
        order); each chunk retrieved compared with its own bytes."""
        import torch

        engine, keys = self.engine, self.keys[s][:chunks]
        tokens, kv = self.tokens[s][:chunks * CHUNK], self.kv[s][:, :, :chunks * CHUNK, :]
        in_cpu = [bool(engine.cpu.contains(k)) for k in keys]
        on_disk = [bool(engine.disk.contains(k)) for k in keys]
        request = f"session-{s}-{label.replace(' ', '-')}"
        hit = int(engine.engine.lookup(tokens, lookup_id=request, pin=True))
        placed = engine.engine.lookup_pins.get(request, {})  # tier -> the keys pinned there
        out = torch.zeros_like(kv)
        if hit:
            mask = engine.engine.retrieve(tokens[:hit], kv=out, req_id=request)
        else:
            mask = torch.zeros(len(tokens), dtype=torch.bool)
        engine.engine.lookup_unpin(request)
        retrieved = [c for c in range(chunks)  # a slice past the mask is empty
                     if _span(c).stop <= len(mask) and bool(mask[_span(c)].all())]
        donors: dict[int, str] = {}
        for c in retrieved:
            got = out[:, :, _span(c), :]
            if not torch.equal(got.view(torch.int16), kv[:, :, _span(c), :].view(torch.int16)):
                donors[c] = self.owners.get(_digest(got), "unknown")
        pairs = list(zip(in_cpu, on_disk, strict=True))
        self.seen.append(SessionSeen(
            session=s, visit=label, chunks=chunks,
            stored=sum(1 for c, d in pairs if c or d),
            from_disk=sum(1 for c, d in pairs if d and not c),
            disk_served=len(placed.get("LocalDiskBackend", ())),
            missing=sum(1 for c, d in pairs if not c and not d),
            retrieved=len(retrieved), wrong=len(donors), donors=donors))
