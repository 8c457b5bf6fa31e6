"""The ``transfer`` replica provider: two processes that own paged KV (vLLM 0.26
FlashAttention NHD, position-coded) and move it through a real LMCache MP server with
LMCache's own client (the adapters vLLM's LMCacheMPConnector drives), no model and no vLLM.

Replica A registers its KV, stores a token sequence from its block ids (under a cache
salt) and dumps the pages it stored. Replica B, a fresh process with other bytes,
registers, looks the tokens up (all must hit), looks them up under a fresh salt (none may
hit: the zero-hit control), retrieves into other block ids and compares every byte of
every retrieved page with A's, and every other page with its own. On ``cpu`` it runs
without a GPU (the processes see no CUDA device), so CPU CI exercises the real server; on
``cuda`` the KV lives on the leased GPU, the server reaches it through CUDA IPC and runs its
GPU copy path (lazy or mixed L1), and an injected delay (fault-sensitivity mode) shows
whether that path is stream-ordered: 8 chunks, more than the server's 4 staging buffers,
so both a stale store (D2H) and an overwritten retrieve (H2D) can show.

    python -m pytest_sharedkv.stack.checks.transfer_provider store|fetch --url URL --model NAME
        --workdir DIR --salt SALT [--device cpu|cuda] [--off-by-one]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.engine_hooks.delay_hook import (
    SERVER_ROLE,
    cycles_label,
    read_log,
    void_problem,
)
from pytest_sharedkv.host.lmcache_api import known_keywords
from pytest_sharedkv.report.records import Problem
from pytest_sharedkv.stack.faults import TransferFaults
from pytest_sharedkv.stack.launch_record import LaunchPaths, LaunchRecord, ReplicaLaunch, launched

if TYPE_CHECKING:
    from pytest_sharedkv.processes.managed import ManagedProcess
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer

LAYERS, HEADS, HEAD_DIM, BLOCK = 2, 2, 16, 16
NUM_BLOCKS = 160
CHUNK = 256  # the transfer's own geometry (no model): 16 blocks a chunk
NUM_TOKENS = 8 * CHUNK  # 8 chunks
SEED_A, SEED_B = 11, 22
DEVICES = ("cpu", "cuda")
BYTES_WRONG = "wrong bytes"
REPLICA_ENV = {
    "LMCACHE_MP_TRANSFER_MODE": "lmcache_driven",  # what the default server serves
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "LMCACHE_DISABLE_BANNER": "1",
    "LMCACHE_LOG_LEVEL": "WARNING",
}


ADAPTER_MODULE = "lmcache.integration.vllm.vllm_multi_process_adapter"
GROUPS_MODULE = "lmcache.integration.vllm.kv_cache_groups"
# What Client drives (the calls vLLM's LMCacheMPConnector makes), by module and class.
API: dict[str, dict[str, tuple[str, ...]]] = {
    ADAPTER_MODULE: {
        "LMCacheMPWorkerAdapter": ("register_kv_caches", "submit_store_request",
                                   "submit_retrieve_request", "get_finished", "shutdown"),
        "LMCacheMPSchedulerAdapter": ("maybe_submit_lookup_request", "check_lookup_result",
                                      "cleanup_lookup_result", "free_lookup_locks",
                                      "end_session", "shutdown"),
        "ParallelStrategy": (), "LoadStoreOp": ()},
    GROUPS_MODULE: {"create_engine_group_infos_from_vllm": ()},
}


def missing_api() -> list[str]:
    """The names of LMCache's client API that Client calls and this LMCache lacks: a version
    the provider does not know is VOID naming them, not a traceback from a replica."""
    import importlib

    missing = []
    for module_name, names in API.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any import failure: the module is unusable
            missing.append(f"{module_name} ({type(exc).__name__}: {exc})")
            continue
        for name, methods in names.items():
            obj = getattr(module, name, None)
            if obj is None:
                missing.append(f"{module_name}.{name}")
                continue
            missing += [f"{name}.{m}" for m in methods if not callable(getattr(obj, m, None))]
    return missing


def tokens() -> list[int]:
    return [(i * 7919 + 13) % 32000 for i in range(NUM_TOKENS)]


def wire_tokens() -> Any:
    """The tokens as the client sends them: 0.5.6 a list; 0.5.7rc2 packed (token_codec)."""
    try:
        from lmcache.v1.multiprocess.token_codec import pack_token_ids
    except ImportError:
        return tokens()
    return pack_token_ids(tokens())


def load_store_op(ids: list[int], end: int) -> Any:
    """LMCache's LoadStoreOp of the tokens up to END into IDS, in its release's fields."""
    from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

    wire = wire_tokens()
    given = {"token_ids": wire} if isinstance(wire, list) else {"token_bytes": wire}
    return LoadStoreOp(**given, block_ids=[ids], start=0, end=end)


def block_plan() -> tuple[list[int], list[int]]:
    """Source ids in A, destination ids in B; block 0 is vLLM's null block, never used."""
    count = NUM_TOKENS // BLOCK
    ids = list(range(1, NUM_BLOCKS))
    a, b = ids[:], ids[:]
    random.Random(1).shuffle(a)
    random.Random(2).shuffle(b)
    return a[:count], b[:count]


def page_bytes() -> int:
    return BLOCK * HEADS * 2 * HEAD_DIM * 2  # bf16 (BS, H, 2D)


def make_kv(seed: int, device: str = "cpu") -> dict[str, Any]:
    """vLLM 0.26 FlashAttention NHD: (NB, H, BS, 2D) over physical (NB, BS, H, 2D)."""
    import torch

    from pytest_sharedkv.layouts.build import FUSED_ORDER, attention_view
    from pytest_sharedkv.layouts.fill import fill_position_coded

    kv = {}
    for layer in range(LAYERS):
        raw = torch.empty(NUM_BLOCKS * page_bytes(), dtype=torch.int8)
        fill_position_coded(raw, seed, layer)
        raw = raw.to(device)
        kv[f"model.layers.{layer}.self_attn.attn"] = attention_view(
            raw, torch.bfloat16, (NUM_BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM), FUSED_ORDER["NHD"])
    return kv


def page(tensor: Any, block: int) -> Any:
    """One block's physical bytes through the tensor's current storage (registration moves
    the pool into shared memory and re-points the tensor)."""
    import torch

    u8 = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    u8.set_(tensor.untyped_storage())
    base = tensor.storage_offset() * tensor.element_size()
    return u8[base + block * page_bytes(): base + (block + 1) * page_bytes()]


def where(offset: int) -> str:
    """The packed_page tier's page geometry, for the NHD page (BS, H, 2D) in bf16."""
    from pytest_sharedkv.layouts.fill import Region

    page = Region("k|v", 0, (("token", BLOCK), ("head", HEADS), ("byte", 2 * HEAD_DIM * 2)))
    return ", ".join(f"{k} {v}" for k, v in page.coordinates(offset).items())


class Client:
    """LMCacheMPWorkerAdapter + LMCacheMPSchedulerAdapter, called as the connector does."""

    def __init__(self, url: str, model: str) -> None:
        import zmq
        from lmcache.integration.vllm.vllm_multi_process_adapter import (
            LMCacheMPSchedulerAdapter,
            LMCacheMPWorkerAdapter,
            ParallelStrategy,
        )

        strategy = ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0,
                                    tp_size=1, pp_size=1, n_servers=1)
        extra = {"lmcache.mp.mp_transfer_mode": "lmcache_driven", "lmcache.mp.mq_timeout": 30.0}
        context: Any = zmq.Context.instance()
        self.worker = LMCacheMPWorkerAdapter(url, context, model, BLOCK, strategy,
                                             extra_config=extra)
        self.scheduler = LMCacheMPSchedulerAdapter([url], context, model, BLOCK, strategy,
                                                   extra_config=extra)
        self.chunk = int(self.worker.lmcache_tokens_per_chunk)

    def register(self, kv: dict[str, Any]) -> None:
        from types import SimpleNamespace

        from lmcache.integration.vllm.kv_cache_groups import create_engine_group_infos_from_vllm

        class AttentionSpec:  # LMCache matches vLLM's spec classes by name
            pass

        class FullAttentionSpec(AttentionSpec):
            block_size = BLOCK

        config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(
            layer_names=list(kv), kv_cache_spec=FullAttentionSpec())])
        hints = {"kv_layout": "NHD"}  # without vLLM the CPU server would assume HND
        infos = create_engine_group_infos_from_vllm(config, kv, layout_hints=hints)
        register = self.worker.register_kv_caches
        register(kv, engine_group_infos=infos, **known_keywords(register, layout_hints=hints))

    def event(self) -> Any:
        """The ordering event a store or retrieve waits on: 0.5.6's adapter makes it;
        0.5.3's connector records an interprocess event on the current stream itself."""
        if hasattr(self.worker, "create_recorded_event"):
            return self.worker.create_recorded_event()
        from lmcache import torch_dev

        event = torch_dev.Event(interprocess=True)
        event.record()
        return event

    def store(self, rid: str, ids: list[int], salt: str) -> bool:
        op = load_store_op(ids, NUM_TOKENS)
        self.worker.submit_store_request(rid, op, self.event(), cache_salt=salt)
        ok = bool(self.worker.store_futures[rid].result(timeout=60))
        self.worker.get_finished({rid})
        return ok

    def lookup(self, rid: str, salt: str, timeout: float = 30.0) -> int:
        self.scheduler.maybe_submit_lookup_request(rid, wire_tokens(), cache_salt=salt)
        deadline = time.monotonic() + timeout
        while (hit := self.scheduler.check_lookup_result(rid)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookup {rid} got no answer in {timeout}s")
            time.sleep(0.002)
        return int(hit)

    def wait_visible(self, prefix: str, salt: str, deadline: float) -> tuple[int, int]:
        """Look up until every stored token hits (stores land asynchronously) or the
        monotonic DEADLINE passes: (tokens hit, lookups made), each lookup PREFIX-N."""
        hit, attempts = 0, 0
        while hit < NUM_TOKENS and time.monotonic() < deadline:
            attempts += 1
            rid = f"{prefix}-{attempts}"
            hit = self.lookup(rid, salt)
            self.release(rid, hit, salt)
        return hit, attempts

    def release(self, rid: str, hit: int, salt: str) -> None:
        self.scheduler.cleanup_lookup_result(rid)
        if hit > 0:
            self.scheduler.free_lookup_locks(wire_tokens(), 0, hit, rid, cache_salt=salt)
        self.scheduler.end_session(rid)

    def retrieve(self, rid: str, ids: list[int], hit: int, salt: str) -> bool:
        self.scheduler.cleanup_lookup_result(rid)
        op = load_store_op(ids, hit)
        self.worker.submit_retrieve_request(rid, op, self.event(), cache_salt=salt)
        ok = bool(self.worker.retrieve_futures[rid][0].result(timeout=60))
        self.worker.get_finished(set())
        self.scheduler.end_session(rid)
        return ok

    def close(self) -> None:
        self.scheduler.shutdown()
        self.worker.shutdown()


def store_role(client: Client, workdir: Path, salt: str, device: str) -> dict[str, Any]:
    import torch

    a_ids, _ = block_plan()
    kv = make_kv(SEED_A, device)
    client.register(kv)
    started, deadline = time.perf_counter(), time.monotonic() + 60
    stored = client.store("sharedkv-a-store", a_ids, salt)
    hit, attempts = client.wait_visible("sharedkv-a-visible", salt, deadline)
    pages = torch.stack([torch.stack([page(t, b).cpu() for b in a_ids]) for t in kv.values()])
    torch.save(pages, workdir / "a-pages.pt")
    return {"stored": stored, "visible_hit_tokens": hit, "lookups_until_visible": attempts,
            "store_s": round(time.perf_counter() - started, 4)}


def fetch_request_id(tag: str = "") -> str:
    """B's lookup and retrieve; TAG tells apart several fetches of one process."""
    return f"sharedkv-b-fetch{tag}"


def fetch_role(client: Client, workdir: Path, salt: str, device: str,
               off_by_one: bool = False, tag: str = "") -> dict[str, Any]:
    """B's part; OFF_BY_ONE (a self-test's planted fault) retrieves each block into the one
    after it, which the page comparison must see."""
    import torch

    a_ids, b_ids = block_plan()
    a_pages = torch.load(workdir / "a-pages.pt")
    kv = make_kv(SEED_B, device)
    client.register(kv)
    before = [[page(t, b).cpu() for b in range(NUM_BLOCKS)] for t in kv.values()]
    control_id, fetch_id = f"sharedkv-b-control{tag}", fetch_request_id(tag)
    control = client.lookup(control_id, salt + "-control")
    client.release(control_id, control, salt + "-control")
    hit = client.lookup(fetch_id, salt)
    moved = b_ids[: hit // BLOCK]
    into = [b % (NUM_BLOCKS - 1) + 1 for b in moved] if off_by_one else moved
    retrieved = client.retrieve(fetch_id, into, hit, salt) if hit else False
    if device == "cuda":
        torch.cuda.synchronize()  # the retrieve's own event is what vLLM waits on; be sure
    mismatches: list[str] = []
    mismatched_pages = untouched_changed = 0
    chunks: set[int] = set()  # the chunks (of A's store) a wrong page belongs to
    target = {b: j for j, b in enumerate(moved)}
    for layer, tensor in enumerate(kv.values()):
        for block in range(NUM_BLOCKS):
            now = page(tensor, block).cpu()
            want = a_pages[layer, target[block]] if block in target else before[layer][block]
            if torch.equal(now, want):
                continue
            diff = now.ne(want)
            first = int(diff.nonzero()[0, 0])
            if block in target:
                mismatched_pages += 1
                chunks.add(target[block] * BLOCK // CHUNK)
            else:
                untouched_changed += 1
            if len(mismatches) < 5:
                source = (f"<- A block {a_ids[target[block]]}" if block in target
                          else "(must not change)")
                source += holds(a_pages[layer], now, a_ids)
                mismatches.append(
                    f"layer {layer}, B block {block} {source}: {int(diff.count_nonzero())} of "
                    f"{page_bytes()} bytes differ, first at {where(first)}: expected "
                    f"0x{int(want[first]):02x}, observed 0x{int(now[first]):02x}")
    return {"hit_tokens": hit, "control_hit_tokens": control, "retrieved": retrieved,
            "pages_compared": LAYERS * len(moved), "mismatched_pages": mismatched_pages,
            "untouched_pages_changed": untouched_changed, "mismatches": mismatches,
            "mismatched_chunks": sorted(chunks)}


def holds(pages: Any, observed: Any, a_ids: list[int]) -> str:
    """Whose bytes a wrong page holds, when they are another of A's pages (a stale or
    overwritten staging buffer moves a neighbouring chunk's bytes)."""
    import torch

    for j, candidate in enumerate(pages):
        if torch.equal(candidate, observed):
            return f", holds A block {a_ids[j]}'s bytes (token block {j})"
    return ""


class WrongBytes(Problem):
    """Pages B retrieved differ from A's, or pages it must not touch changed: counted page
    by page. (Each problem of a transfer check is a ``report.records.Problem`` whose class
    says which kind; the score reads the class, never the text.)"""

    KIND = "bytes"


class NotMoved(Problem):
    """The KV did not move as it must (A's store never visible, B hit short or its
    retrieve failed): no page can be judged."""

    KIND = "hits"


class SaltLeak(Problem):
    """A fresh cache salt hit: namespaces do not separate."""

    KIND = "leak"


class Failed(Problem):
    """A process of the check failed (died, timed out, survived its teardown)."""

    KIND = "process"


class Void(Problem):
    """The check proves nothing (the delay never ran; LMCache lacks the client API)."""

    KIND = "void"


@dataclass
class TransferOutcome:
    store: dict[str, Any] = field(default_factory=dict)
    fetch: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # Problem subclasses: typed
    server: str = ""
    allocator: str = ""
    delayed_calls: dict[str, int] | None = None
    void: str | None = None  # why a delayed check proves nothing
    launch: LaunchRecord | None = None  # what run_pair launched

    def verdict(self) -> tuple[str, str]:
        """The record's (kind, status): a fresh salt that hit is an isolation failure;
        else the bytes."""
        if self.void:
            return "bytes", "void"
        if self.fetch.get("control_hit_tokens"):
            return "isolation", "fail"
        return "bytes", "fail" if self.problems else "pass"

    def score(self) -> tuple[int, int]:
        """(pages right, pages compared) for the report; a failure of anything but the
        bytes (no hits, a dead process, a void delay) counts every page as not passed."""
        compared = int(self.fetch.get("pages_compared") or 0)
        if not self.problems:
            return compared or 1, compared or 1
        if compared and all(isinstance(p, WrongBytes) for p in self.problems):
            wrong = int(self.fetch.get("mismatched_pages", 0))
            return max(compared - wrong, 0), compared
        return 0, compared or 1


@dataclass(frozen=True)
class TransferCase:
    """One cell of the transfer provider's matrix (``faults``: what a self-test planted,
    never part of its id)."""

    device: str = "cpu"
    allocator: str = "mixed"
    delay: int = 0
    faults: TransferFaults = field(default_factory=TransferFaults)

    @property
    def id(self) -> str:
        delay = f"-delay{cycles_label(self.delay)}" if self.delay else ""
        return f"{self.device}-{self.allocator}{delay}"


def _cleanup_shm(pid: int) -> None:
    """Shared-memory segments a killed replica leaves (/dev/shm/lmcache_kv_<pid>_<n>)."""
    for leftover in Path("/dev/shm").glob(f"lmcache_kv_{pid}_*"):
        leftover.unlink(missing_ok=True)


def run_pair(workdir: Path, salt: str, device: str = "cpu", allocator: str = "mixed",
             delay_cycles: int = 0, timeout: float = 300.0,
             faults: TransferFaults | None = None) -> TransferOutcome:
    """A real LMCache server and replicas A and B started with it (A stores once it is
    ready, B fetches once A has stored); always torn down.

    ``cpu``: nobody sees a GPU (LMCache turns lazy L1 off there: the effective allocator
    is reported). ``cuda``: the server and both replicas share the leased GPU; with
    ``delay_cycles`` all three load the fault-sensitivity hook. ``faults``: what a
    self-test planted in B.
    """
    from pytest_sharedkv.processes.managed import ManagedProcess, ProcessFailed
    from pytest_sharedkv.stack.launch.providers import process_env
    from pytest_sharedkv.stack.launch.spec import LaunchSpec, inject_log
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    outcome = TransferOutcome()
    spec = LaunchSpec(log_dir=workdir, allocator=allocator, inject_delay_cycles=delay_cycles)
    hidden = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    server = LMCacheServer(ServerConfig(allocator=allocator, l1_size_gb=0.25, chunk_size=CHUNK),
                           workdir, env={**process_env(spec, role=SERVER_ROLE), **hidden})
    # Both replicas start with the server: their imports (torch, LMCache's adapters) overlap
    # its start. A waits for the server-ready file, B for A's result, so the order (server
    # ready, A stores, B fetches) holds.
    ready = workdir / "server.ready"
    replicas: dict[str, ManagedProcess] = {}
    try:
        server.launch()
        for role, after in (("store", ready), ("fetch", workdir / "store.json")):
            name = "A" if role == "store" else "B"
            argv = [sys.executable, "-m", "pytest_sharedkv.stack.checks.transfer_provider", role,
                    "--url", server.url, "--model", "sharedkv-transfer", "--workdir", str(workdir),
                    "--salt", salt, "--device", device, "--after", str(after),
                    "--after-timeout", str(timeout + server.config.ready_timeout)]
            if role == "fetch" and faults is not None:
                argv += faults.argv()
            env = {**process_env(spec, role=f"replica {name}"), **REPLICA_ENV, **hidden}
            replicas[role] = ManagedProcess(f"transfer replica {name}", argv,
                                            workdir / f"replica-{role}.log", env=env)
            replicas[role].start()
        server.wait_ready()
        ready.touch()
        outcome.allocator = server.effective_allocator()
        outcome.server = f"lmcache server ({outcome.allocator}, {device}), {server.url}"
        outcome.launch = _launch_record(server, replicas, device, delay_cycles, workdir)
        for role, replica in replicas.items():
            code = replica.wait_exit(timeout, f"finish its {role}")
            result = workdir / f"{role}.json"
            if code != 0 or not result.exists():
                raise replica.failure(f"exited with status {code} without a result")
            found = json.loads(result.read_text())
            setattr(outcome, role, found)
            if found.get("unsupported"):
                outcome.void = unsupported_void(found)
                break
    except ProcessFailed as exc:
        outcome.problems.append(Failed(str(exc)))
    finally:
        for replica in replicas.values():
            replica.stop()
            if replica.proc is not None:  # one whose start raised has no pid
                _cleanup_shm(replica.proc.pid)
        leftovers = server.stop()
        if leftovers:
            outcome.problems.append(Failed(f"LMCache server processes {leftovers} survived "
                                           "teardown"))
    if delay_cycles:
        outcome.delayed_calls = dict(read_log(inject_log(workdir)))
    if outcome.void and not outcome.problems:
        outcome.problems.append(Void(outcome.void))
    elif not outcome.problems:
        outcome.problems.extend(judge(outcome.store, outcome.fetch))
        void = void_problem(outcome.delayed_calls, "check") if delay_cycles else None
        if void:
            outcome.void = void
            outcome.problems.insert(0, Void(void))
    return outcome


def _launch_record(server: LMCacheServer, replicas: Mapping[str, ManagedProcess],
                   device: str, delay_cycles: int, workdir: Path) -> LaunchRecord:
    """What run_pair launched: the server and the two replica processes (no engine)."""
    processes = [server.process, *replicas.values()]
    return LaunchRecord(
        provider=f"transfer ({device})", description=f"transfer x2 + {server.url}",
        replicas=tuple(ReplicaLaunch("A" if role == "store" else "B", None,
                                     log=process.log_path)
                       for role, process in replicas.items()),
        allocator=server.effective_allocator(), delay_cycles=delay_cycles, arm="ON",
        processes=tuple(launched(p.name, p.argv, p.env) for p in processes),
        server=server.config, paths=LaunchPaths(log_dir=workdir))


def _lmcache_version() -> str:
    from pytest_sharedkv.host.environment import dist_version

    return dist_version("lmcache") or "(version unknown)"


def unsupported_void(result: dict[str, Any]) -> Void:
    """Why a replica that found LMCache's client API incomplete proves nothing."""
    return Void(f"VOID: LMCache {result.get('lmcache')} lacks what the transfer provider calls "
            f"({', '.join(result['unsupported'])}): it cannot drive this version, so no byte "
            "was moved or judged")


def judge(store: dict[str, Any], fetch: dict[str, Any]) -> list[str]:
    """What A's store and B's fetch results show wrong, each of its kind."""
    problems: list[str] = []
    if not store.get("stored") or store.get("visible_hit_tokens") != NUM_TOKENS:
        problems.append(NotMoved(f"replica A's store did not become visible: {store}"))
    if fetch.get("control_hit_tokens"):
        problems.append(SaltLeak(f"a fresh cache_salt hit {fetch['control_hit_tokens']} "
                                 "tokens: salts do not separate namespaces"))
    if fetch.get("hit_tokens") != NUM_TOKENS:
        problems.append(NotMoved(f"replica B hit {fetch.get('hit_tokens')} of {NUM_TOKENS} "
                                 "tokens"))
    if fetch.get("hit_tokens") and not fetch.get("retrieved"):
        problems.append(NotMoved("replica B's retrieve reported failure"))
    if fetch.get("mismatched_pages") or fetch.get("untouched_pages_changed"):
        problems.append(WrongBytes(
            f"{BYTES_WRONG}: {fetch['mismatched_pages']} of {fetch.get('pages_compared')} "
            f"retrieved page(s) differ from replica A's and "
            f"{fetch['untouched_pages_changed']} other page(s) changed; first: "
            + "; ".join(fetch.get("mismatches", [])[:2])))
    return problems


def _wait_for(path: Path, timeout: float) -> None:
    """Until PATH exists (written whole: the store role writes its result last)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout:g}s (the store never "
                               "finished)")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("store", "fetch"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--salt", default="")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--after", type=Path, default=None,
                        help="wait for this file (the server-ready file, or the store's "
                        "result) before connecting")
    parser.add_argument("--after-timeout", type=float, default=300.0)
    parser.add_argument("--off-by-one", action="store_true",
                        help="fetch: retrieve each block into the one after it (a fault the "
                        "self-tests plant: the page comparison must see it)")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (the slow imports, before any wait: they overlap it)

    missing = missing_api()  # imports LMCache's adapters
    if args.after is not None:
        _wait_for(args.after, args.after_timeout)
    result: dict[str, Any]
    if missing:
        result = {"role": args.role, "unsupported": missing, "lmcache": _lmcache_version()}
    else:
        client = Client(args.url, args.model)
        try:
            if args.role == "store":
                found = store_role(client, args.workdir, args.salt, args.device)
            else:
                found = fetch_role(client, args.workdir, args.salt, args.device,
                                   off_by_one=args.off_by_one)
            result = {"role": args.role, "chunk": client.chunk, **found}
        finally:
            client.close()
    out = args.workdir / f"{args.role}.json"  # whole or absent: B waits for the store's
    partial = out.with_suffix(".json.partial")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(out)
    sys.stdout.write("SHAREDKV-TRANSFER " + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
