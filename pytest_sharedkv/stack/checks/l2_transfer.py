"""The transfer check across hosts (model-free, the transfer provider's own client): KV
stored through one LMCache server (the writer) reaches another (a reader, standing for a
server on another host that never saw it) only through the L2 they share.

Replica A stores one salt a case through the writer. The L2 write is asynchronous (the
store returns before LMCache's store controller has written anything), so the reader is
not asked until the case's L2 holds every key of its salt: polled, with a deadline whose
failure names what was missing. Then the planted faults go in, and replica B, per case,
looks up and retrieves through that case's reader and compares every page byte for byte
with A's. A reader's lookup consults L2 every time and caches no miss; its own account of
where the keys came from (``l2_log.KeySplit``) must say L2, not its L1 and not nowhere.

Cases (``HostCase.fault``): ``none`` (a full hit from L2, byte-exact); the reader without
an L2 (the control: 0 hit); ``corrupt`` (a byte flipped in the L2 entry: the compare must
see exactly that page wrong); ``gap`` (the reader's ``fault_inject`` adapter fails one
key's load: the lookup trims to the prefix before it, which must be byte-exact; a hit past
the gap fails).

    python -m pytest_sharedkv.stack.checks.l2_transfer store --url URL --workdir DIR --salt S...
    python -m pytest_sharedkv.stack.checks.l2_transfer fetch --workdir DIR --job NAME URL SALT...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.report.records import Problem
from pytest_sharedkv.stack.checks.transfer_provider import (
    CHUNK,
    NUM_TOKENS,
    REPLICA_ENV,
    SEED_A,
    _cleanup_shm,
    _wait_for,
    block_plan,
    fetch_request_id,
    make_kv,
    missing_api,
    page,
    unsupported_void,
)
from pytest_sharedkv.stack.l2.backends import FILE_SUFFIX, L2, DirectoryL2, first_gap
from pytest_sharedkv.stack.l2.log import KeySplit

if TYPE_CHECKING:
    from pytest_sharedkv.processes.managed import ManagedProcess
    from pytest_sharedkv.processes.mount_ns import CappedTmpfs
    from pytest_sharedkv.stack.checks.transfer_provider import Client
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer

KEYS = NUM_TOKENS // CHUNK  # LMCache's keys for one store: one a chunk (one KV rank)
MODEL = "sharedkv-transfer"
FAULTS = ("none", "corrupt", "gap")
STORED = "stored.json"  # A's stores returned (written before its pages are dumped)
L2_READY = "l2.ready"  # the L2 holds every case's keys and the faults are planted


@dataclass(frozen=True)
class HostCase:
    """One reader and what it must see: NAME is also the case's salt suffix and the tag of
    its request ids; L2 None is the control (the reader has no L2)."""

    name: str
    reader: LMCacheServer
    l2: L2 | None
    fault: str = "none"

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, not {self.fault!r}")
        if self.fault == "gap" and self.gap is None:
            raise ValueError(f"case {self.name}: a gap needs a reader with a fault_inject "
                             "adapter that has gap_indices")

    @property
    def gap(self) -> int | None:
        """The first key the reader's fault_inject adapter fails to load, if any."""
        gaps = [g for a in self.reader.config.l2_adapters
                if (g := first_gap(json.loads(a))) is not None]
        return min(gaps) if gaps else None

    @property
    def expected_hit(self) -> int:
        if self.l2 is None:
            return 0
        if self.fault == "gap" and self.gap is not None:
            return min(self.gap, KEYS) * CHUNK
        return NUM_TOKENS

    @property
    def tag(self) -> str:
        return f"-{self.name}"




@dataclass
class HostsOutcome:
    case: str
    l2: str
    fault: str
    store: dict[str, Any] = field(default_factory=dict)
    fetch: dict[str, Any] = field(default_factory=dict)
    split: KeySplit | None = None
    l2_visible_s: float | None = None  # the store's return -> every key in the L2
    planted: str | None = None
    problems: list[Problem] = field(default_factory=list)
    void: str | None = None
    seen: dict[str, Any] | None = None  # the write-failure cell: WriteFailureSeen.as_dict

    def verdict(self) -> tuple[str, str]:
        """(kind, status): void, the first problem's kind and fail, or a pass."""
        if self.void:
            return "void", "void"
        if self.problems:
            return self.problems[0].kind, "fail"
        return "l2-transfer", "pass"

    def as_dict(self) -> dict[str, Any]:
        kind, status = self.verdict()
        return {"case": self.case, "l2": self.l2, "fault": self.fault, "kind": kind,
                "status": status, "hit_tokens": self.fetch.get("hit_tokens"),
                "split": self.split.as_dict() if self.split else None,
                "l2_visible_s": self.l2_visible_s, "planted": self.planted,
                "fetch_s": self.fetch.get("fetch_s"),
                "problems": [p.record() for p in self.problems], "void": self.void,
                **({"seen": self.seen} if self.seen is not None else {})}


def judge(case: HostCase, fetch: dict[str, Any], split: KeySplit | None) -> list[Problem]:
    """What B's fetch through CASE's reader got wrong against what the case must see."""
    problems: list[Problem] = []
    if fetch.get("control_hit_tokens"):
        problems.append(Problem(f"a fresh cache_salt hit {fetch['control_hit_tokens']} "
                                "tokens: salts do not separate namespaces", "leak"))
    hit, expected = fetch.get("hit_tokens"), case.expected_hit
    if hit != expected:
        if case.l2 is None:
            why = "without an L2 (the KV reached it some other way)"
        elif case.fault == "gap":
            why = (f"with key {case.gap} failing to load: only the {expected} tokens before "
                   "the gap may hit")
        else:
            why = "through the L2"
        problems.append(Problem(f"server 2 ({case.reader.url}) hit {hit} of "
                                f"{NUM_TOKENS} tokens {why}; expected {expected}", "hits"))
    if not expected or not hit:
        return problems
    if not fetch.get("retrieved"):
        problems.append(Problem("server 2's retrieve reported failure", "hits"))
    keys = hit // CHUNK
    if split is None or not split.known or split.l1 != 0 or split.l2 != keys \
            or split.retained != keys:
        problems.append(Problem(f"server 2's keys did not all come from L2: "
                                f"{split.describe() if split else 'no split read'}; "
                                f"expected {keys}/{KEYS} retained keys (0 L1, {keys} L2)",
                                "source"))
    wrong = int(fetch.get("mismatched_pages", 0))
    changed = int(fetch.get("untouched_pages_changed", 0))
    first = "; ".join(fetch.get("mismatches", [])[:2])
    if case.fault == "corrupt":
        if wrong != 1 or changed:
            problems.append(Problem(f"the byte planted in L2 showed as {wrong} wrong "
                                    f"page(s) of {fetch.get('pages_compared')} (expected 1) "
                                    f"and {changed} other page(s) changed" + (
                                        f"; first: {first}" if first else ""), "bytes"))
    elif wrong or changed:
        problems.append(Problem(f"wrong bytes: {wrong} of {fetch.get('pages_compared')} "
                                f"retrieved page(s) differ from replica A's and {changed} other "
                                f"page(s) changed; first: {first}", "bytes"))
    return problems


def _replica(role: str, argv: list[str], workdir: Path) -> ManagedProcess:
    from pytest_sharedkv.processes.managed import ManagedProcess

    env = {**os.environ, **REPLICA_ENV, "CUDA_VISIBLE_DEVICES": ""}
    return ManagedProcess(f"l2 transfer replica {role}", [
        sys.executable, "-m", "pytest_sharedkv.stack.checks.l2_transfer", role, "--workdir",
        str(workdir), *argv], workdir / f"replica-{role}.log", env=env)


def wait_l2(cases: Sequence[HostCase], salts: dict[str, str], exited: Callable[[], bool],
            workdir: Path, deadline_s: float, timeout: float
            ) -> tuple[dict[str, float], dict[str, Any]]:
    """Until A's stores returned and each case's L2 holds its salt's KEYS entries (or the
    deadline, DEADLINE_S after the stores returned; or A EXITED without storing): when each
    was first seen whole, and when each store returned."""
    seen: dict[str, float] = {}
    stored: dict[str, Any] = {}
    waiting = [c for c in cases if c.l2 is not None]
    started = time.monotonic()
    stored_mono: float | None = None
    while True:
        if not stored and (workdir / STORED).exists():
            stored = json.loads((workdir / STORED).read_text())
            stored_mono = time.monotonic()
        if stored:
            for case in waiting:
                if case.name not in seen and case.l2 is not None:
                    held = case.l2.entries(salts[case.name])
                    if held is not None and len(held) >= KEYS:
                        seen[case.name] = time.time()
        done = exited()
        if done and not stored:
            break
        if done and (len(seen) == len(waiting) or (
                stored_mono is not None and time.monotonic() - stored_mono > deadline_s)):
            break
        if time.monotonic() - started > timeout:
            break
        time.sleep(0.005)
    return seen, stored


def missing_in_l2(case: HostCase, salt: str, deadline_s: float) -> Problem:
    """What the L2 lacked when the wait for CASE's keys ended."""
    assert case.l2 is not None
    held = case.l2.entries(salt)
    count = case.l2.count()
    return Problem(f"{case.l2.describe()} held "
                   f"{'an unreadable number' if held is None else len(held)} of the {KEYS} "
                   f"entries of salt {salt} {deadline_s:g}s after the store returned "
                   f"({'unknown' if count is None else count} entries in all)", "l2")


def run_across_hosts(workdir: Path, writer: LMCacheServer, cases: Sequence[HostCase],
                     salt: str, timeout: float = 180.0,
                     l2_deadline: float = 30.0) -> dict[str, HostsOutcome]:
    """Every case of one store (replica A, through WRITER) and one fetching process (replica
    B, each case through its reader), the servers already started and left running."""
    from pytest_sharedkv.processes.managed import ProcessFailed

    salts = {case.name: f"{salt}-{case.name}" for case in cases}
    outcomes = {c.name: HostsOutcome(c.name, c.l2.describe() if c.l2 else "none", c.fault)
                for c in cases}
    store = _replica("store", ["--url", writer.url, "--model", MODEL,
                               *[a for c in cases for a in ("--salt", salts[c.name])]], workdir)
    fetch = _replica("fetch", ["--model", MODEL, "--after", str(workdir / L2_READY),
                               "--after-timeout", str(timeout),
                               *[a for c in cases for a in ("--job", c.name, c.reader.url,
                                                            salts[c.name])]], workdir)
    failed: list[Problem] = []
    try:
        store.start()
        fetch.start()  # its imports overlap A's store and the L2 wait
        seen, stored = wait_l2(cases, salts, lambda: not store.alive(), workdir, l2_deadline,
                               timeout)
        code = store.wait_exit(timeout, "finish its stores")
        result = workdir / "store.json"
        if code != 0 or not result.exists():
            raise store.failure(f"exited with status {code} without a result")
        store_result = json.loads(result.read_text())
        if store_result.get("unsupported"):
            for outcome in outcomes.values():
                outcome.void = unsupported_void(store_result)
            return outcomes
        for case in cases:
            outcome = outcomes[case.name]
            outcome.store = store_result["salts"][salts[case.name]]
            visible = outcome.store.get("visible_hit_tokens") == NUM_TOKENS
            if not outcome.store.get("stored") or not visible:
                outcome.problems.append(Problem("replica A's store through the "
                                                f"writer did not become visible: {outcome.store}",
                                                "process"))
            if case.l2 is None:
                continue
            if case.name in seen:
                outcome.l2_visible_s = round(seen[case.name] - stored[salts[case.name]], 4)
            else:
                outcome.problems.append(missing_in_l2(case, salts[case.name], l2_deadline))
            if case.fault == "corrupt":
                entries = case.l2.entries(salts[case.name]) or []
                try:
                    outcome.planted = case.l2.corrupt(entries[0]) if entries else None
                except (OSError, ValueError, NotImplementedError) as exc:
                    outcome.void = f"VOID: the byte could not be planted in L2: {exc}"
                if outcome.planted is None and outcome.void is None:
                    outcome.void = (f"VOID: no entry of salt {salts[case.name]} in "
                                    f"{case.l2.describe()} to plant a byte in")
        (workdir / L2_READY).touch()
        code = fetch.wait_exit(timeout, "finish its fetches")
        result = workdir / "fetch.json"
        if code != 0 or not result.exists():
            raise fetch.failure(f"exited with status {code} without a result")
        fetched = json.loads(result.read_text())
        if fetched.get("unsupported"):
            for outcome in outcomes.values():
                outcome.void = unsupported_void(fetched)
            return outcomes
        for case in cases:
            outcome = outcomes[case.name]
            outcome.fetch = fetched["jobs"].get(case.name, {})
            if outcome.fetch.get("error"):
                outcome.problems.append(Problem(f"replica B's fetch through "
                                                f"{case.reader.url}: {outcome.fetch['error']}",
                                                "process"))
                continue
            outcome.split = case.reader.key_split(fetch_request_id(case.tag))
            outcome.problems += judge(case, outcome.fetch, outcome.split)
            for server, role in ((case.reader, "server 2"), (writer, "server 1")):
                why = server.l2_error()
                if why is not None and case.l2 is not None:
                    outcome.problems.insert(0, Problem(f"{role} lost its L2 during the "
                                                       f"check: {why}", "l2"))
    except ProcessFailed as exc:
        failed.append(Problem(str(exc), "process"))
    finally:
        for replica in (store, fetch):
            if replica.proc is not None:
                replica.stop()
                _cleanup_shm(replica.pid)
    for outcome in outcomes.values():
        outcome.problems[:0] = failed
    return outcomes


def store_salts(client: Client, workdir: Path, salts: list[str]) -> dict[str, Any]:
    """A: one registration, one store a salt (the time each returned, written at once for
    the L2 wait), each then visible in the writer, and the pages it stored."""
    import torch

    a_ids, _ = block_plan()
    kv = make_kv(SEED_A)
    client.register(kv)
    done: dict[str, float] = {}
    stored: dict[str, bool] = {}
    for salt in salts:
        stored[salt] = client.store(f"sharedkv-a-store-{salt}", a_ids, salt)
        done[salt] = time.time()
    _write_json(workdir / STORED, done)
    results: dict[str, Any] = {}
    for salt in salts:
        hit, attempts = client.wait_visible(f"sharedkv-a-visible-{salt}", salt,
                                            time.monotonic() + 60)
        results[salt] = {"stored": stored[salt], "visible_hit_tokens": hit,
                         "lookups_until_visible": attempts}
    pages = torch.stack([torch.stack([page(t, b) for b in a_ids]) for t in kv.values()])
    torch.save(pages, workdir / "a-pages.pt")
    return {"salts": results}


def fetch_jobs(model: str, workdir: Path, jobs: list[list[str]]) -> dict[str, Any]:
    """B: per job (NAME, URL, SALT), a client of that reader, the transfer provider's fetch."""
    from pytest_sharedkv.stack.checks.transfer_provider import Client, fetch_role

    results: dict[str, Any] = {}
    for name, url, salt in jobs:
        started = time.perf_counter()
        try:
            client = Client(url, model)
            try:
                results[name] = fetch_role(client, workdir, salt, "cpu", tag=f"-{name}")
            finally:
                client.close()
        except Exception as exc:  # one reader's failure (a lookup never answered) is its own
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["fetch_s"] = round(time.perf_counter() - started, 4)
    return {"jobs": results}


def _write_json(path: Path, data: Any) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1))
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("store", "fetch"))
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--url", help="store: the writer")
    parser.add_argument("--salt", action="append", default=[], help="store: one a case")
    parser.add_argument("--job", nargs=3, action="append", default=[],
                        metavar=("NAME", "URL", "SALT"), help="fetch: one a case")
    parser.add_argument("--after", type=Path, default=None)
    parser.add_argument("--after-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (the slow imports, before any wait: they overlap it)

    from pytest_sharedkv.stack.checks.transfer_provider import Client, _lmcache_version

    missing = missing_api()
    if args.after is not None:
        _wait_for(args.after, args.after_timeout)
    result: dict[str, Any]
    if missing:
        result = {"role": args.role, "unsupported": missing, "lmcache": _lmcache_version()}
    elif args.role == "store":
        client = Client(args.url, args.model)
        try:
            result = store_salts(client, args.workdir, args.salt)
        finally:
            client.close()
    else:
        result = fetch_jobs(args.model, args.workdir, args.job)
    _write_json(args.workdir / f"{args.role}.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# A HostsOutcome's problem kinds as the report's record kinds (report.records.Kind).
RECORD_KINDS = {"leak": "isolation", "hits": "hits", "source": "hits", "bytes": "bytes",
                "l2": "hits", "process": "error", "void": "bytes", "l2-transfer": "bytes"}


def record_verdict(outcome: HostsOutcome) -> tuple[str, str]:
    """(record kind, status) of OUTCOME: a pass is a byte-exact transfer (kind bytes)."""
    kind, status = outcome.verdict()
    return RECORD_KINDS.get(kind, "error"), status


def check_through(l2: L2, workdir: Path, salt: str, gap: int,
                  env: dict[str, str] | None = None) -> dict[str, HostsOutcome]:
    """The transfer check across hosts over the session's L2 (started, left running): a
    writer and a reader over L2, a reader through fault_inject (gap index GAP) over it, a
    reader without an L2 (the control); cases none, corrupt (a byte flipped in L2), gap and
    no-l2. The servers run on CPU and are stopped before this returns."""
    from pytest_sharedkv.stack.l2.backends import fault_inject
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if env is None else env
    servers: list[LMCacheServer] = []

    def server(role: str, *adapters: str) -> LMCacheServer:
        made = LMCacheServer(ServerConfig(l1_size_gb=0.25, chunk_size=CHUNK,
                                          l2_adapters=adapters), workdir, env=env, role=role)
        servers.append(made)
        return made

    try:
        writer = server("1", l2.adapter_json())
        reader = server("2", l2.adapter_json())
        gapped = server("2 (fault_inject)", json.dumps(fault_inject(l2, (gap,))))
        control = server("2 (no L2)")
        for each in servers:
            each.launch()
        for each in servers:
            each.wait_ready()
        cases = [HostCase("l2", reader, l2), HostCase("corrupt", reader, l2, "corrupt"),
                 HostCase("gap", gapped, l2, "gap"), HostCase("no-l2", control, None)]
        run = workdir / "run"
        run.mkdir(exist_ok=True)
        return run_across_hosts(run, writer, cases, salt)
    finally:
        for each in servers:
            each.stop()


# The write-failure cell: two writers store one salt at once into an L2 that refuses writes
# because it is full, as two replicas do when one prompt reaches both cold: a Redis at its
# memory limit (noeviction), or a directory (fs_native, fs) on a size-capped tmpfs.
WRITE_FAILURE = "write-failure"
# What the full Redis may hold above an empty server's own use: the two stores' values
# (2 x 512 KiB) and the servers' connection buffers need more, so some writes land and the
# rest are refused (on Redis 7.0.15: 5 of 16 SETs landed, 11 refused).
WRITE_FAILURE_HEADROOM = 1 << 20
# The tmpfs under a directory L2: one salt is KEYS entries of 64 KiB (a file each, the
# same 512 KiB the Redis holds), each writer stores all of them; 320 KiB holds 5 entries
# of one writer's 8 (the other writer's files of the same keys replace them whole or fail).
WRITE_FAILURE_CAPACITY = 320 << 10
FULL_TYPES = ("resp", "fs_native", "fs")


@dataclass(frozen=True)
class WriteFailureSeen:
    """What the L2 and the writers said once the stores were over: the writes the Redis
    refused (None: unreadable; a filesystem's are not counted: None), the keys each writer
    logged it could not write (None: its log unreadable), and the salt's entries the L2
    held. A filesystem (FILESYSTEM) also says the bytes it had free and the size of a
    whole entry (the largest file of the salt; None: none there), and how many of the
    held entries were shorter than that, and the names in the directory that are no entry
    (a staging file left behind)."""

    refused: int | None
    failed_keys: tuple[int | None, ...]
    held: int | None
    filesystem: bool = False
    free_bytes: int | None = None
    entry_bytes: int | None = None
    short: int | None = None
    strays: tuple[str, ...] | None = None

    @property
    def full(self) -> bool:
        """The filesystem had less free than one entry needs (the next write: ENOSPC)."""
        return (self.filesystem and self.free_bytes is not None
                and self.entry_bytes is not None and self.free_bytes < self.entry_bytes)

    def void(self) -> str | None:
        """Why nothing was tested (no write failed, or that is unknown); None: it was."""
        if not self.filesystem:
            if self.refused is None:
                return ("VOID: the Redis's refused writes (INFO errorstats) could not be "
                        "read: whether any L2 write failed is unknown")
            if self.refused == 0:
                return ("VOID: the Redis at its memory limit refused no write: no L2 "
                        "write failed, so nothing was tested")
            return None
        if any(self.failed_keys) or self.full:
            return None
        if None in self.failed_keys or self.free_bytes is None or self.entry_bytes is None:
            return ("VOID: whether the filesystem refused a write is unknown: the writers' "
                    f"failed keys {list(self.failed_keys)}, {self.free_bytes} bytes free, "
                    f"an entry {self.entry_bytes} bytes (None: unreadable)")
        return (f"VOID: the capped filesystem refused no write: no writer logged a failed "
                f"store and {self.free_bytes} bytes were free (an entry is "
                f"{self.entry_bytes}), so nothing was tested")

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"refused": self.refused, "failed_keys": list(self.failed_keys),
                                 "held": self.held}
        if self.filesystem:
            found.update(free_bytes=self.free_bytes, entry_bytes=self.entry_bytes,
                         short=self.short, full=self.full,
                         strays=None if self.strays is None else list(self.strays))
        return found


def _chunks(first: int, count: int) -> str:
    return (f"chunk {first}" if count == 1 else f"chunks {first}-{first + count - 1}")


def judge_write_failure(fetch: dict[str, Any], split: KeySplit | None,
                        seen: WriteFailureSeen) -> tuple[list[Problem], str | None]:
    """(problems, void) of a reader's fetch after writes failed: it may miss, or hit only
    what the L2 holds, from the L2, every byte A's; a hit with other bytes, or one whose
    retrieve failed, names the chunk. VOID where no write failed (nothing was tested) or
    that is unknown."""
    problems: list[Problem] = []
    if fetch.get("control_hit_tokens"):
        problems.append(Problem(f"a fresh cache_salt hit {fetch['control_hit_tokens']} "
                                "tokens: salts do not separate namespaces", "leak"))
    hit = int(fetch.get("hit_tokens") or 0)
    wrong = int(fetch.get("mismatched_pages", 0))
    changed = int(fetch.get("untouched_pages_changed", 0))
    if wrong or changed:
        chunks = fetch.get("mismatched_chunks") or []
        named = (f"chunk{'s' if len(chunks) > 1 else ''} "
                 f"{', '.join(str(c) for c in chunks)}" if chunks else "no chunk named")
        first = "; ".join(fetch.get("mismatches", [])[:2])
        problems.append(Problem(f"a hit with other bytes after failed L2 writes: "
                                f"{named} of the {hit} tokens hit ({wrong} of "
                                f"{fetch.get('pages_compared')} page(s) wrong, {changed} "
                                f"other page(s) changed); first: {first}", "bytes"))
    if hit:
        keys = hit // CHUNK
        if not fetch.get("retrieved"):
            problems.append(Problem(f"the reader's retrieve reported failure: "
                                    f"{_chunks(0, keys)} were visible to its lookup", "hits"))
        if seen.held is not None and keys > seen.held:
            problems.append(Problem(f"the reader hit {hit} tokens ({keys} chunks) but "
                                    f"the L2 held {seen.held} of the salt's {KEYS} entries"
                                    + (" whole" if seen.filesystem else ""), "hits"))
        if split is None or not split.known or split.l1 != 0 or split.l2 != keys:
            problems.append(Problem("the reader's keys did not all come from L2: "
                                    f"{split.describe() if split else 'no split read'}; "
                                    f"expected {keys} from L2", "source"))
    return problems, seen.void()


class FullL2:
    """An L2 the check fills (started, filled by the writers, stopped): what the servers
    are given, a prefix their argv runs under, and what it says once the stores are over."""

    l2: L2
    prefix: Sequence[str] = ()

    def start(self) -> str:
        """Started; what was planted (its limit)."""
        raise NotImplementedError

    def seen(self, failed: tuple[int | None, ...], held: list[str] | None) -> WriteFailureSeen:
        raise NotImplementedError

    def stop(self) -> list[int]:
        """Stopped, once the servers are; what is left of it (pids)."""
        return self.l2.stop()


class FullRedis(FullL2):
    """A Redis the suite starts, tightened to HEADROOM above its own use, noeviction."""

    def __init__(self, workdir: Path, headroom: int) -> None:
        from pytest_sharedkv.stack.l2 import backends as l2_module
        from pytest_sharedkv.stack.l2.backends import RedisL2

        self.headroom = headroom
        redis = l2_module.suite_redis(workdir, "resp", maxmemory=64 << 20)  # tightened below
        assert isinstance(redis, RedisL2)
        self.l2 = self.redis = redis

    def start(self) -> str:
        from pytest_sharedkv.stack.l2 import redis_server

        self.redis.start()
        limit = redis_server.limit_memory(self.redis.host, self.redis.port, self.headroom)
        return (f"Redis maxmemory {limit} bytes ({self.headroom} above its own use), "
                "policy noeviction")

    def seen(self, failed: tuple[int | None, ...], held: list[str] | None) -> WriteFailureSeen:
        from pytest_sharedkv.stack.l2 import redis_server

        return WriteFailureSeen(redis_server.refused_writes(self.redis.host, self.redis.port),
                                failed, None if held is None else len(held))


class CappedDirectoryL2(DirectoryL2):
    """A directory L2 on a CappedTmpfs: the servers (inside its namespace) are given the
    mountpoint; the suite reads it through the holder's root."""

    def __init__(self, mount: CappedTmpfs, adapter_type: str) -> None:
        super().__init__(mount.view, adapter_type, create=False)
        self.mount = mount

    def adapter(self) -> dict[str, Any]:
        return {"type": self.adapter_type, "base_path": str(self.mount.mountpoint)}

    def describe(self) -> str:
        return (f"{self.adapter_type} -> {self.mount.mountpoint} (a {self.mount.size}-byte "
                "tmpfs)")


class FullDirectory(FullL2):
    """A directory L2 (ADAPTER_TYPE fs_native or fs) on a tmpfs of CAPACITY bytes in a
    private mount namespace (``processes/mount_ns.py``); L2Unavailable (mount-refused)
    where this host cannot mount one."""

    def __init__(self, workdir: Path, adapter_type: str, capacity: int,
                 wrap: Sequence[str] = ()) -> None:
        from pytest_sharedkv.processes.mount_ns import CappedTmpfs

        self.mount = CappedTmpfs(workdir, capacity, wrap)
        self.adapter_type = adapter_type
        self.logs: list[Path] = []  # the writers' logs, for their failure lines

    def start(self) -> str:
        from pytest_sharedkv.processes.mount_ns import MountRefused
        from pytest_sharedkv.stack.l2.backends import L2Problem, L2Unavailable, adapter_problem

        missing = adapter_problem(self.adapter_type)
        if missing is not None:
            raise L2Unavailable(missing)
        try:
            self.mount.start()
        except MountRefused as exc:
            raise L2Unavailable(L2Problem("mount-refused", str(exc))) from None
        self.l2 = self.directory = CappedDirectoryL2(self.mount, self.adapter_type)
        self.prefix = self.mount.enter()
        return (f"{self.adapter_type} base_path on a tmpfs of {self.mount.size} bytes "
                f"(mount namespace {self.mount.namespace}), {self.mount.free_bytes()} free")

    def seen(self, failed: tuple[int | None, ...], held: list[str] | None) -> WriteFailureSeen:
        sizes: list[int] | None = None
        if held is not None:
            try:
                sizes = [(self.directory.path / name).stat().st_size for name in held]
            except OSError:
                sizes = None
        entry = max(sizes) if sizes else None
        try:
            strays: tuple[str, ...] | None = tuple(sorted(
                p.name for p in self.directory.path.iterdir()
                if not p.name.endswith(FILE_SUFFIX)))
        except OSError:
            strays = None
        return WriteFailureSeen(
            None, failed, None if sizes is None else sum(s == entry for s in sizes),
            filesystem=True, free_bytes=self.mount.free_bytes(), entry_bytes=entry,
            short=None if sizes is None else sum(s != entry for s in sizes), strays=strays)

    def stop(self) -> list[int]:
        return self.mount.stop()


@dataclass
class WritesOver:
    """Where the L2 writes of each salt stood when the two writers' stores were over (or
    the deadline passed): each salt's entries held at the last poll (None: unknown), each
    writer's failed keys as its log said them (None: unread), the salts still pending
    (neither every entry held nor a failure logged by every writer), the seconds waited."""

    held: dict[str, int | None]
    failed: dict[str, tuple[int | None, ...]]
    pending: tuple[str, ...]
    seconds: float


def wait_writes_over(need: Mapping[str, int], held: Callable[[str], int | None],
                     failures: Callable[[str], tuple[int | None, ...]], deadline_s: float,
                     poll_s: float = 0.01) -> WritesOver:
    """The two-writers cell's wait, one implementation for the model-free check and the
    service tier's cell: poll until each salt of NEED (salt -> entries it stores) is over,
    the L2 holding its entries (HELD: how many it holds now, None unknown) or every writer
    having logged a failed write of it (FAILURES: each writer's count, None unread), or
    DEADLINE_S passed."""
    started = time.monotonic()
    seen: dict[str, int | None] = {}
    failed: dict[str, tuple[int | None, ...]] = {}
    pending = dict(need)
    while True:
        for salt in list(pending):
            seen[salt], failed[salt] = held(salt), failures(salt)
            count = seen[salt]
            if (count is not None and count >= pending[salt]) or all(failed[salt]):
                del pending[salt]
        if not pending or time.monotonic() - started > deadline_s:
            break
        time.sleep(poll_s)
    return WritesOver(seen, failed, tuple(pending), round(time.monotonic() - started, 4))


def logged_failures(log: Path, salt: str) -> int | None:
    """store_failures of the log at LOG; None where it cannot be read (unknown, not 0)."""
    from pytest_sharedkv.stack.l2.log import store_failures

    try:
        return store_failures(log.read_text(errors="replace"), salt)
    except OSError:
        return None


def full_l2(l2_type: str, workdir: Path, headroom: int, capacity: int,
            wrap: Sequence[str] = ()) -> FullL2:
    if l2_type == "resp":
        return FullRedis(workdir, headroom)
    if l2_type in ("fs_native", "fs"):
        return FullDirectory(workdir, l2_type, capacity, wrap)
    raise ValueError(f"the write-failure cell fills one of {FULL_TYPES}, not {l2_type!r}")


def check_write_failure(workdir: Path, salt: str, env: dict[str, str] | None = None,
                        headroom: int = WRITE_FAILURE_HEADROOM, timeout: float = 180.0,
                        deadline_s: float = 30.0, l2_type: str = "resp",
                        capacity: int = WRITE_FAILURE_CAPACITY,
                        wrap: Sequence[str] = ()) -> HostsOutcome:
    """Two writers (servers 1 and 2, one store process each, started together) store the
    same salt into a full L2 (L2_TYPE): ``resp``, a Redis the suite starts with noeviction
    and maxmemory HEADROOM above its own use; ``fs_native`` or ``fs``, a directory on a
    tmpfs of CAPACITY bytes the check mounts (WRAP: a prefix for its holder). Once each
    writer's store is over (the L2 holds every key, or the writer logged the keys it could
    not write), a reader (server 3, which stored nothing) looks up and retrieves it through
    that L2: a miss, or a hit of only what the L2 holds, byte for byte A's. L2Unavailable
    where no Redis can be started or no tmpfs mounted."""
    from pytest_sharedkv.processes.managed import ProcessFailed
    from pytest_sharedkv.stack.l2.log import store_failures
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if env is None else env
    full = full_l2(l2_type, workdir, headroom, capacity, wrap)
    outcome = HostsOutcome(WRITE_FAILURE, l2_type if l2_type != "resp" else full.l2.describe(),
                           WRITE_FAILURE)
    servers: list[LMCacheServer] = []
    replicas: list[ManagedProcess] = []
    try:
        outcome.planted = full.start()
        l2 = full.l2
        if l2_type != "resp":
            outcome.l2 = l2.describe()
        for role in ("1", "2", "3 (reader)"):
            servers.append(LMCacheServer(ServerConfig(
                l1_size_gb=0.25, chunk_size=CHUNK, l2_adapters=(l2.adapter_json(),)),
                workdir, env=env, role=role, prefix=full.prefix))
        for each in servers:
            each.launch()
        writers, reader = servers[:2], servers[2]
        for index, writer in enumerate(writers):
            own = workdir / f"store-{index + 1}"
            own.mkdir(exist_ok=True)
            replicas.append(_replica("store", ["--url", writer.url, "--model", MODEL,
                                               "--salt", salt], own))
        fetch_dir = workdir / "store-1"  # A's pages: what every retrieved byte must equal
        fetch = _replica("fetch", ["--model", MODEL, "--after", str(workdir / L2_READY),
                                   "--after-timeout", str(timeout), "--job", "reader",
                                   reader.url, salt], fetch_dir)
        replicas.append(fetch)
        for each in servers:
            each.wait_ready()
        for replica in replicas:  # the two stores at once; the fetch's imports overlap them
            replica.start()
        stored: list[dict[str, Any]] = []
        for index, replica in enumerate(replicas[:2]):
            code = replica.wait_exit(timeout, "finish its store")
            result = workdir / f"store-{index + 1}" / "store.json"
            if code != 0 or not result.exists():
                raise replica.failure(f"exited with status {code} without a result")
            stored.append(json.loads(result.read_text()))
        if any(s.get("unsupported") for s in stored):
            outcome.void = unsupported_void(next(s for s in stored if s.get("unsupported")))
            return outcome
        outcome.store = {f"writer {i + 1}": s["salts"][salt] for i, s in enumerate(stored)}
        for name, result in outcome.store.items():
            if not result.get("stored") or result.get("visible_hit_tokens") != NUM_TOKENS:
                outcome.problems.append(Problem(f"{name}'s store did not become "
                                                f"visible in its own server: {result}", "process"))
        entries: dict[str, Any] = {}

        def held_now(name: str) -> int | None:
            entries[name] = l2.entries(name)
            return None if entries[name] is None else len(entries[name])

        def failures(name: str) -> tuple[int | None, ...]:
            return (tuple(store_failures(w.process.log_text(), name) for w in writers)
                    if l2_type == "resp" else
                    tuple(logged_failures(w.process.log_path, name) for w in writers))

        over = wait_writes_over({salt: KEYS}, held_now, failures, deadline_s)
        held, failed = entries.get(salt), over.failed.get(salt, ())
        if over.pending:  # each writer's L2 write over: every key there, or its failure logged
            outcome.problems.append(Problem(f"{deadline_s:g}s after both stores "
                                            f"returned, {l2.describe()} held "
                                            f"{'unknown' if held is None else len(held)} "
                                            f"of the {KEYS} entries and the writers had "
                                            f"logged {list(failed)} failed key(s)", "l2"))
        outcome.l2_visible_s = over.seconds  # the stores over
        seen = full.seen(failed, held)
        (workdir / L2_READY).touch()
        code = fetch.wait_exit(timeout, "finish its fetch")
        result = fetch_dir / "fetch.json"
        if code != 0 or not result.exists():
            raise fetch.failure(f"exited with status {code} without a result")
        outcome.fetch = json.loads(result.read_text())["jobs"].get("reader", {})
        outcome.seen = seen.as_dict()
        if outcome.fetch.get("error"):
            outcome.problems.append(Problem(f"the reader's fetch: "
                                            f"{outcome.fetch['error']}", "process"))
            return outcome
        outcome.split = reader.key_split(fetch_request_id("-reader"))
        problems, outcome.void = judge_write_failure(outcome.fetch, outcome.split, seen)
        outcome.problems += problems
    except ProcessFailed as exc:
        outcome.problems.insert(0, Problem(str(exc), "process"))
    finally:
        stop_launched(replicas, servers)
        left = full.stop()
        if left and l2_type != "resp":
            outcome.problems.insert(0, Problem(f"processes {left} were still in "
                                               "the tmpfs's mount namespace after the check: "
                                               "its mount lives while they do", "process"))
    return outcome


def stop_launched(replicas: Sequence[ManagedProcess], servers: Sequence[LMCacheServer]) -> None:
    """A cell's teardown: each driver that started (and the shared memory it left), then
    each server."""
    for replica in replicas:
        if replica.proc is not None:
            replica.stop()
            _cleanup_shm(replica.pid)
    for each in servers:
        each.stop()
