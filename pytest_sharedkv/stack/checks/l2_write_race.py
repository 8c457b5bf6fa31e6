"""LMCache #4991 with its condition forced and shown (CPU, model-free, the transfer
provider's client): two LMCache MP servers store one salt at once into one ``fs`` L2
directory, writer 2 with other bytes than writer 1; inside writer 1's server the staging
write of the salt's first key stops part-way (a short write), waits until writer 2's write
of the same key has begun, then fails with ``OSError`` (``engine_hooks/write_race_hook.py``);
then a third server, which stored nothing, looks the salt up and retrieves it through the
same directory, and every page it serves is compared with both writers' pages.

The verdict (``Verdict``): VOID where the interleaving did not occur (the hook's log lacks
writer 1's short write at an offset inside the entry, writer 2's start on that same
staging file after it, or writer 1's error after that start) or the reader did not fetch;
``reproduced`` where a served chunk is not wholly one writer's bytes (torn, zeroed, or
another's); ``not reproduced`` where every served chunk is one writer's whole, or the
reader missed. The counts (stores failed per writer, keys served, pages compared and whose
they are) and the hook's lines go into the JSON report ``run`` writes.

LMCache's ``fs_native`` adapter writes in C++ (``lmcache_fs``: ``<key>.tmp``, ``write_all``,
``rename``), where a hook in Python cannot stop a write part-way: it is not raced here.

    python -m pytest_sharedkv.stack.checks.l2_write_race run --workdir DIR --out REPORT.json
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import write_race_hook as hook
from pytest_sharedkv.stack.checks.l2_transfer import stop_launched
from pytest_sharedkv.stack.checks.transfer_provider import (
    BLOCK,
    CHUNK,
    LAYERS,
    NUM_TOKENS,
    REPLICA_ENV,
    _lmcache_version,
    _wait_for,
    block_plan,
    fetch_request_id,
    make_kv,
    page,
)

KEYS = NUM_TOKENS // CHUNK
MODEL = "sharedkv-write-race"
SALT = "wr4991"  # no dot: the staging name is the entry's with its suffix replaced
SEEDS = {"writer 1": 11, "writer 2": 33}  # other bytes for the same keys
READER_SEED = 44  # the reader's own pool before the retrieve: neither writer's
READY = "stores.over"
REPORT_NAME = "lmcache-4991-write-race"
ISSUE = "LMCache #4991"


class Verdict(enum.Enum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    VOID = "void"


# A served page's source, and a chunk's.
WRITER_1, WRITER_2, UNCHANGED, OTHER, MIXED = (
    "writer 1", "writer 2", "unchanged", "other", "mixed")


def condition(events: list[dict[str, Any]], hold: bool = False, truncate: bool = False
              ) -> tuple[dict[str, Any], str | None]:
    """The interleaving as the hook logged it: (evidence, why it did not occur or None);
    HOLD: writer 2 was to keep its staging file until writer 1's clean-up unlinked it;
    TRUNCATE: the truncating order (``truncating``)."""
    def first(event: str, role: hook.Role) -> dict[str, Any] | None:
        return next((e for e in events if e.get("event") == event
                     and e.get("role") == role.value), None)

    if truncate:
        return truncating(events, first)

    short, begun = first("short", hook.Role.FAIL), first("begun", hook.Role.RACE)
    raised = first("raise", hook.Role.FAIL)
    found = {"short": short, "begun": begun, "raise": raised,
             "order": [f"{e.get('role')}:{e.get('event')}" for e in events
                       if e.get("event") not in ("armed", "swapped")]}
    if short is None:
        return found, "writer 1's hook logged no short write (the fs adapter never wrote the key)"
    offset, size = short.get("offset"), short.get("size")
    if not (isinstance(offset, int) and isinstance(size, int) and 0 < offset < size):
        return found, f"writer 1's write stopped at {offset} of {size}: not part-way"
    if begun is None or not begun.get("saw"):
        return found, "writer 2's write of the key did not begin after writer 1's short write"
    if begun.get("file") != short.get("file"):
        return found, (f"the writers raced different keys ({short.get('file')} and "
                       f"{begun.get('file')})")
    if raised is None or not raised.get("saw"):
        return found, "writer 1 did not fail after writer 2's write had begun"
    held = first("held", hook.Role.RACE)
    found["held"] = held
    if hold and not (held and held.get("saw")):
        return found, ("writer 1's clean-up did not unlink the staging file while writer 2 "
                       "held it")
    return found, None


def truncating(events: list[dict[str, Any]], first: Any
               ) -> tuple[dict[str, Any], str | None]:
    """The truncating order: writer 2 wrote its whole entry, writer 1 opened (truncated)
    that staging file after it, writer 2 renamed it, then writer 1 failed at offset 0."""
    written, waited = first("written", hook.Role.RACE), first("waited", hook.Role.FAIL)
    raised = first("raise", hook.Role.FAIL)
    name = (written or {}).get("file")
    renamed = next((e for e in events if e.get("event") == "replace" and e.get("role")
                    == hook.Role.RACE.value and e.get("file") == name), None)
    found = {"short": raised, "begun": written, "raise": raised, "renamed": renamed,
             "order": [f"{e.get('role')}:{e.get('event')}" for e in events
                       if e.get("event") not in ("armed", "swapped")]}
    if written is None or written.get("offset") != written.get("size"):
        return found, "writer 2 did not write its whole entry"
    if waited is None or not waited.get("saw") or waited.get("file") != name:
        return found, "writer 1 did not open the same staging file after writer 2 wrote it"
    if renamed is None or not renamed.get("ok"):
        return found, "writer 2 did not rename the staging file after writer 1 opened it"
    if raised is None or not raised.get("saw") or raised.get("file") != name:
        return found, "writer 1's write did not fail after writer 2's rename"
    return found, None


def judge(events: list[dict[str, Any]], fetch: dict[str, Any] | None, hold: bool = False,
          truncate: bool = False) -> tuple[Verdict, str]:
    """The verdict and its reason, from the hook's lines and the reader's fetch."""
    found, why = condition(events, hold, truncate)
    if why is not None:
        return Verdict.VOID, f"VOID: the interleaving did not occur: {why}"
    if not fetch or fetch.get("error") or fetch.get("hit_tokens") is None:
        return Verdict.VOID, ("VOID: the reader did not fetch the key: "
                              f"{(fetch or {}).get('error', 'no fetch result')}")
    short = found["short"]
    torn = [i for i, c in enumerate(fetch.get("chunks", [])) if c not in (WRITER_1, WRITER_2)]
    occurred = (f"writer 2 wrote the whole of {short['file']}, writer 1 opened (truncated) it, "
                f"writer 2 renamed it, then writer 1's write failed at offset 0; the reader "
                f"hit {fetch['hit_tokens']} tokens" if truncate else
                f"writer 1's write of {short['file']} stopped at offset {short['offset']} of "
                f"{short['size']}, writer 2's write of it began, then writer 1's failed; the "
                f"reader hit {fetch['hit_tokens']} tokens")
    if fetch.get("hit_tokens") and not fetch.get("retrieved"):
        return Verdict.REPRODUCED, (f"reproduced: {occurred}, and the retrieve of the keys "
                                    "its lookup found failed: an entry of a failed store "
                                    "stayed visible")
    if torn:
        return Verdict.REPRODUCED, (f"reproduced: {occurred}, and served chunk(s) "
                                    f"{', '.join(map(str, torn))} not wholly one writer's "
                                    f"bytes ({', '.join(fetch['chunks'][i] for i in torn)})")
    served = "a miss" if not fetch["hit_tokens"] else "every chunk one writer's whole"
    return Verdict.NOT_REPRODUCED, f"not reproduced (the condition occurred): {occurred}; {served}"


# -- the replicas (one process each, the transfer provider's client) ----------------------

def store(url: str, workdir: Path, seed: int) -> dict[str, Any]:
    import torch

    from pytest_sharedkv.stack.checks.transfer_provider import Client

    a_ids, _ = block_plan()
    kv = make_kv(seed)
    client = Client(url, MODEL)
    try:
        client.register(kv)
        stored = client.store("sharedkv-race-store", a_ids, SALT)
        hit, _ = client.wait_visible("sharedkv-race-visible", SALT, time.monotonic() + 60)
    finally:
        client.close()
    pages = torch.stack([torch.stack([page(t, b) for b in a_ids]) for t in kv.values()])
    torch.save(pages, workdir / "pages.pt")
    return {"stored": stored, "visible_hit_tokens": hit}


def fetch(url: str, writers: list[Path]) -> dict[str, Any]:
    """Lookup and retrieve through the reader; each served page named by whose it is."""
    import torch

    from pytest_sharedkv.stack.checks.transfer_provider import Client

    _, b_ids = block_plan()
    sources = {name: torch.load(d / "pages.pt") for name, d in zip(SEEDS, writers, strict=True)}
    kv = make_kv(READER_SEED)
    client = Client(url, MODEL)
    try:
        client.register(kv)
        before = [[page(t, b).clone() for b in b_ids] for t in kv.values()]
        rid = fetch_request_id("-race")
        hit = client.lookup(rid, SALT)
        moved = b_ids[: hit // BLOCK]
        retrieved = client.retrieve(rid, moved, hit, SALT) if hit else False
    finally:
        client.close()
    pages: Counter[str] = Counter()
    by_chunk: list[set[str]] = [set() for _ in range(hit // CHUNK)]
    for layer, tensor in enumerate(kv.values()):
        for j, block in enumerate(moved):
            now = page(tensor, block)
            source = next((name for name, held in sources.items()
                           if torch.equal(now, held[layer, j])),
                          UNCHANGED if torch.equal(now, before[layer][j]) else OTHER)
            pages[source] += 1
            by_chunk[j * BLOCK // CHUNK].add(source)
    chunks = [next(iter(s)) if len(s) == 1 else MIXED for s in by_chunk]
    return {"hit_tokens": hit, "retrieved": retrieved, "pages_compared": LAYERS * len(moved),
            "pages": dict(pages), "chunks": chunks}


ADAPTER_FAILED = "FSL2Adapter failed to store"  # fs_l2_adapter.py:657, one a file


def failed_files(log: Path) -> int | None:
    """The staging writes of the salt a writer's fs adapter logged as failed (None: its log
    unreadable); the store controller's line lists every key of the task instead."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    return sum(1 for line in text.splitlines() if ADAPTER_FAILED in line and f"@{SALT}" in line)


def _write_json(path: Path, data: Any) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)


# -- the cell -----------------------------------------------------------------------------

def _replica(role: str, argv: list[str], workdir: Path) -> Any:
    from pytest_sharedkv.processes.managed import ManagedProcess

    env = {**os.environ, **REPLICA_ENV, "CUDA_VISIBLE_DEVICES": ""}
    return ManagedProcess(f"write race {role}", [
        sys.executable, "-m", "pytest_sharedkv.stack.checks.l2_write_race", role, "--workdir",
        str(workdir), *argv], workdir / f"replica-{role}.log", env=env)


def _hooked_env(run_dir: Path, role: hook.Role, hold: bool = False,
                truncate: bool = False) -> dict[str, str]:
    inject = Path(hook.__file__).parent / "inject"
    return {**os.environ, **({hook.HOLD_ENV: "1"} if hold else {}),
            **({hook.TRUNCATE_ENV: "1"} if truncate else {}),
            "CUDA_VISIBLE_DEVICES": "", hook.DIR_ENV: str(run_dir),
            hook.ROLE_ENV: role.value, hook.SALT_ENV: SALT,
            "PYTHONPATH": os.pathsep.join(p for p in (str(inject),
                                                      os.environ.get("PYTHONPATH", "")) if p)}


def run(workdir: Path, hold: bool = False, timeout: float = 180.0,
        deadline_s: float = 60.0, truncate: bool = False) -> dict[str, Any]:
    """The cell, every process torn down before it returns: the report (a dict). HOLD:
    writer 2 keeps its staging file until writer 1's clean-up has unlinked it; TRUNCATE:
    the truncating order (writer 1 truncates writer 2's written staging file, then fails)."""
    from pytest_sharedkv.engine_hooks.hook_log import read_log
    from pytest_sharedkv.stack.checks.l2_transfer import logged_failures
    from pytest_sharedkv.stack.l2.backends import DirectoryL2
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    run_dir, directory = workdir / "race", DirectoryL2(workdir / "l2", "fs")
    run_dir.mkdir(parents=True, exist_ok=True)
    directory.start()
    adapter = (directory.adapter_json(),)
    envs = [_hooked_env(run_dir, hook.Role.FAIL, truncate=truncate),
            _hooked_env(run_dir, hook.Role.RACE, hold, truncate),
            {**os.environ, "CUDA_VISIBLE_DEVICES": ""}]
    servers = [LMCacheServer(ServerConfig(l1_size_gb=0.25, chunk_size=CHUNK,
                                          l2_adapters=adapter), workdir, env=env, role=role)
               for role, env in zip(("1", "2", "3 (reader)"), envs, strict=True)]
    writer_dirs = [workdir / "writer-1", workdir / "writer-2"]
    replicas: list[Any] = []
    report: dict[str, Any] = {"cell": REPORT_NAME, "issue": ISSUE,
                              "lmcache": _lmcache_version(), "l2": "fs", "salt": SALT,
                              "keys": KEYS, "chunk_tokens": CHUNK, "hold": hold,
                              "truncate": truncate}
    failed: list[int | None] = [None, None]
    result: dict[str, Any] | None = None
    try:
        for each in servers:
            each.launch()
        for d, seed, server in zip(writer_dirs, SEEDS.values(), servers, strict=False):
            d.mkdir(exist_ok=True)
            replicas.append(_replica("store", ["--url", server.url, "--seed", str(seed)], d))
        reader = _replica("fetch", ["--url", servers[2].url, "--after", str(run_dir / READY),
                                    *[a for d in writer_dirs for a in ("--writer", str(d))]],
                          workdir)
        replicas.append(reader)
        for each in servers:
            each.wait_ready()
        for replica in replicas:
            replica.start()
        for replica, d in zip(replicas[:2], writer_dirs, strict=True):
            code = replica.wait_exit(timeout, "finish its store")
            if code != 0 or not (d / "store.json").exists():
                raise replica.failure(f"exited with status {code} without a result")
        report["stores"] = {name: json.loads((d / "store.json").read_text())
                            for name, d in zip(SEEDS, writer_dirs, strict=True)}
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:  # each writer's L2 store over
            failed = [logged_failures(s.process.log_path, SALT) for s in servers[:2]]
            held = directory.entries(SALT) or []
            if failed[0] and (failed[1] or len(held) >= KEYS):
                break
            time.sleep(0.01)
        (run_dir / READY).touch()
        code = reader.wait_exit(timeout, "finish its fetch")
        if code != 0 or not (workdir / "fetch.json").exists():
            raise reader.failure(f"exited with status {code} without a result")
        result = json.loads((workdir / "fetch.json").read_text())
        report["split"] = servers[2].key_split(fetch_request_id("-race")).as_dict()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        stop_launched(replicas, servers)
    events = read_log(run_dir / hook.LOG)
    evidence, _ = condition(events, hold, truncate)
    verdict, why = judge(events, result, hold, truncate)
    logs = [s.process.log_path for s in servers[:2]]
    raced = (evidence["short"] or {}).get("file")
    final = (directory.path / raced).with_suffix(".data") if raced else None
    report.update({
        "verdict": verdict.value, "why": why, "condition": evidence,
        "counts": {"stores_failed": dict(zip(SEEDS, map(failed_files, logs), strict=True)),
                   "keys_logged_failed": dict(zip(SEEDS, failed, strict=True)),
                   "keys_served": None if result is None else result["hit_tokens"] // CHUNK,
                   "pages_compared": None if result is None else result["pages_compared"],
                   "pages": None if result is None else result["pages"]},
        "chunks": None if result is None else result["chunks"],
        "retrieved": None if result is None else result["retrieved"],
        "raced_entry": None if final is None else {
            "name": final.name, "bytes": final.stat().st_size if final.exists() else None,
            "staging_left": final.with_suffix(hook.STAGING_SUFFIX).exists()},
        "entries_held": len(directory.entries(SALT) or []),
        "hook_lines": events})
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("store", "fetch", "run"))
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--url")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--writer", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path, help="run: the JSON report")
    parser.add_argument("--hold", action="store_true",
                        help="run: writer 2 keeps its staging file until writer 1 unlinked it")
    parser.add_argument("--truncate", action="store_true",
                        help="run: writer 1 truncates writer 2's written staging file, fails")
    args = parser.parse_args(argv)
    if args.role == "run":
        report = run(args.workdir, args.hold, truncate=args.truncate)
        _write_json(args.out or args.workdir / "report.json", report)
        print(report["why"])
        return 0
    if args.role == "store":
        _write_json(args.workdir / "store.json", store(args.url, args.workdir, args.seed))
        return 0
    import torch  # noqa: F401  (the slow imports before the wait)

    _wait_for(args.after, 300.0)
    _write_json(args.workdir / "fetch.json", fetch(args.url, args.writer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
