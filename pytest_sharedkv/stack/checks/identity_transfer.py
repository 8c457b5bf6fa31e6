"""The identity tier's cells on the real LMCache MP server, model-free (issue 50): drivers
that own paged KV and speak LMCache's own client (``transfer_provider.Client``), several
servers over one persistent ``fs`` L2 directory, and, where a second LMCache release is
installed in a site of its own, servers and drivers of that release on the same L2.

``run_identity``: server W (chunk 256) with its driver: store under the tenant's salt,
fetch it back into other blocks (the salt's and the chunk's positive control), look it up
under another salt (must miss); W stops; server R (chunk 256, a restart: a fresh L1, the
same L2) fetches it (restart's positive control), server R2 (chunk 512: a changed
configuration under the same name) fetches it (must miss, or bytes exact).
``run_releases``: each release writes its own salt through a server of its own into one
L2; restarted servers of each release fetch both salts: the same release's is the control,
the other's is the direction (keys found and bytes exact / refused / wrong bytes served).

    python -m pytest_sharedkv.stack.checks.identity_transfer --url URL --workdir DIR --name NAME
        --ops JSON [--salt-blind]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_sharedkv.stack.checks.transfer_provider import (
    BLOCK,
    CHUNK,
    NUM_TOKENS,
    REPLICA_ENV,
    SEED_A,
    SEED_B,
)

MODEL = "sharedkv-identity"  # one served name for every server and release
OTHER_CHUNK = 2 * CHUNK
CHECKOUT = Path(__file__).resolve().parents[3]  # what a driver of another release imports


@dataclass
class Observed:
    """What the drivers saw, by op name (each a dict: hit, exact, pages...), and what kept
    a part from running (``problems``, by part)."""

    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    servers: dict[str, str] = field(default_factory=dict)  # part -> release, chunk, url

    def op(self, name: str) -> dict[str, Any]:
        return self.ops.get(name, {})


def site_env(site: Path | None) -> dict[str, str]:
    """The environment of a process of the release installed at SITE (None: this one)."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), str(CHECKOUT), env.get("PYTHONPATH", "")) if p)
    return env


def release_at(site: Path | None) -> str:
    """The LMCache release a process of SITE runs (None: the installed one), from disk."""
    import importlib.util

    from pytest_sharedkv.host.lmcache_api import release_of

    if site is not None:
        return release_of(site / "lmcache")
    spec = importlib.util.find_spec("lmcache")  # top-level: found, not imported
    if spec is None or not spec.submodule_search_locations:
        return "(not installed)"
    return release_of(Path(next(iter(spec.submodule_search_locations))))


class _Part:
    """One server and its driver (started together: the driver's imports overlap the
    server's start), stopped on exit."""

    def __init__(self, name: str, workdir: Path, l2_json: str, chunk: int, ops: list[Any],
                 site: Path | None, extra: list[str]) -> None:
        from pytest_sharedkv.processes.managed import ManagedProcess
        from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

        self.name, self.workdir = name, workdir
        env = {**site_env(site), "CUDA_VISIBLE_DEVICES": ""}
        self.server = LMCacheServer(ServerConfig(allocator="mixed", l1_size_gb=0.25,
                                                 chunk_size=chunk, l2_adapters=(l2_json,)),
                                    workdir, env=env, role=name)
        self.ready = workdir / f"{name}.ready"
        argv = [sys.executable, "-m", "pytest_sharedkv.stack.checks.identity_transfer", "--url",
                self.server.url, "--workdir", str(workdir), "--name", name, "--ops",
                json.dumps(ops), "--after", str(self.ready), *extra]
        self.driver = ManagedProcess(f"identity driver {name}", argv,
                                     workdir / f"driver-{name}.log",
                                     env={**env, **REPLICA_ENV})

    def __enter__(self) -> _Part:
        self.server.launch()
        self.driver.start()
        return self

    def finish(self, timeout: float) -> dict[str, Any]:
        self.server.wait_ready()
        self.ready.touch()
        code = self.driver.wait_exit(timeout, "finish its ops")
        result = self.workdir / f"{self.name}.json"
        if code != 0 or not result.exists():
            raise self.driver.failure(f"exited with status {code} without a result")
        found: dict[str, Any] = json.loads(result.read_text())
        return found

    def __exit__(self, *exc: object) -> None:
        self.driver.stop()
        if self.driver.proc is not None:
            from pytest_sharedkv.stack.checks.transfer_provider import _cleanup_shm

            _cleanup_shm(self.driver.proc.pid)
        self.server.stop()


Phase = list[tuple[str, int, list[Any], Path | None]]  # (name, chunk, ops, site)


def _run_phases(observed: Observed, phases: list[Phase], between: list[Any],
                workdir: Path, l2_json: str, extra: list[str], timeout: float) -> None:
    """Every part of PHASES started at once (the imports and server starts overlap); each
    phase's drivers let go only after the phase before finished and BETWEEN[i] (a
    callable) ran: a later phase's servers are restarted ones, with an L1 that never held
    the earlier phase's KV. Their ops' results into OBSERVED."""
    from contextlib import ExitStack

    from pytest_sharedkv.processes.managed import ProcessFailed

    with ExitStack() as stack:
        started: list[list[_Part]] = []
        for phase in phases:
            parts = []
            for name, chunk, ops, site in phase:
                parts.append(stack.enter_context(
                    _Part(name, workdir, l2_json, chunk, ops, site, extra)))
                observed.servers[name] = f"LMCache {release_at(site)}, chunk {chunk}"
            started.append(parts)
        for index, parts in enumerate(started):
            if index:
                between[index - 1]()
            for part in parts:
                try:
                    found = part.finish(timeout)
                except ProcessFailed as exc:
                    observed.problems[part.name] = str(exc)
                    continue
                if found.get("unsupported"):
                    observed.problems[part.name] = ("LMCache lacks what the client calls: "
                                                    + ", ".join(found["unsupported"]))
                observed.ops.update(found.get("ops", {}))


def _wait_held(l2: Any, salt: str, count: int, timeout: float = 60.0) -> int:
    """Until the L2 holds COUNT entries of SALT (stores reach the L2 after L1); what it
    held at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        held = len(l2.entries(salt) or [])
        if held >= count or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def run_identity(workdir: Path, salt: str, other_salt: str, salt_blind: bool = False,
                 timeout: float = 300.0, restart: bool = True) -> Observed:
    """The salt, chunk-size and restart cells' observations (see the module's doc);
    RESTART False: server W's part alone (the salt's cells)."""
    from pytest_sharedkv.stack.l2.backends import DirectoryL2

    l2 = DirectoryL2(workdir / "l2")
    l2.start()
    extra = ["--salt-blind"] if salt_blind else []
    observed = Observed()
    first = [{"op": "store", "name": "w-store", "salt": salt, "seed": SEED_A},
             {"op": "fetch", "name": "w-fetch", "salt": salt, "pages": "w-store"},
             {"op": "lookup", "name": "w-other-salt", "salt": other_salt}]
    fetch = [{"op": "fetch", "name": "{part}-fetch", "salt": salt, "pages": "w-store",
              "seed": SEED_B}]

    def held() -> None:
        observed.ops["l2-held"] = {"entries": _wait_held(l2, "" if salt_blind else salt,
                                                         NUM_TOKENS // CHUNK)}

    later: list[Phase] = [[("R", CHUNK, _named(fetch, "r"), None),
                           ("R2", OTHER_CHUNK, _named(fetch, "r2"), None)]] if restart else []
    _run_phases(observed, [[("W", CHUNK, first, None)], *later], [held], workdir,
                l2.adapter_json(), extra, timeout)
    return observed


def run_releases(workdir: Path, salt: str, site: Path, timeout: float = 300.0) -> Observed:
    """Each release writes its own salt into one L2; restarted servers of each fetch both."""
    from pytest_sharedkv.stack.l2.backends import DirectoryL2

    l2 = DirectoryL2(workdir / "l2")
    l2.start()
    observed = Observed()
    old, new = f"{salt[:100]}-old", f"{salt[:100]}-new"
    writes = [("OLD-W", CHUNK, [{"op": "store", "name": "old-store", "salt": old,
                                 "seed": SEED_A}], None),
              ("NEW-W", CHUNK, [{"op": "store", "name": "new-store", "salt": new,
                                 "seed": SEED_B}], site)]
    def held() -> None:
        for name, which in (("old", old), ("new", new)):
            observed.ops[f"{name}-held"] = {"entries": _wait_held(l2, which,
                                                                  NUM_TOKENS // CHUNK)}

    def reads(prefix: str) -> list[dict[str, Any]]:
        return [{"op": "fetch", "name": f"{prefix}-reads-old", "salt": old,
                 "pages": "old-store", "seed": 33},
                {"op": "fetch", "name": f"{prefix}-reads-new", "salt": new,
                 "pages": "new-store"}]

    _run_phases(observed, [writes, [("OLD-R", CHUNK, reads("old"), None),
                                    ("NEW-R", CHUNK, reads("new"), site)]],
                [held], workdir, l2.adapter_json(), [], timeout)
    return observed


def _named(ops: list[dict[str, Any]], part: str) -> list[dict[str, Any]]:
    return [{**op, "name": op["name"].format(part=part)} for op in ops]


# ---- the driver (runs in its own process, of whichever release its PYTHONPATH gives) ----

def _fetch(client: Any, kv: dict[str, Any], op: dict[str, Any], salt: str,
           workdir: Path) -> dict[str, Any]:
    import torch

    from pytest_sharedkv.stack.checks.transfer_provider import block_plan, page

    _, b_ids = block_plan()
    rid = f"sharedkv-identity-{op['name']}"
    hit = client.lookup(rid, salt)
    moved = b_ids[: hit // BLOCK]
    retrieved = client.retrieve(rid, moved, hit, salt) if hit else False
    if not hit:
        client.release(rid, hit, salt)
    expected = torch.load(workdir / f"pages-{op['pages']}.pt")
    wrong = sum(not torch.equal(page(t, b).cpu(), expected[layer, j])
                for layer, t in enumerate(kv.values()) for j, b in enumerate(moved))
    compared = len(kv) * len(moved)
    return {"hit": hit, "retrieved": retrieved, "pages_compared": compared,
            "mismatched_pages": wrong, "exact": bool(hit) and retrieved and not wrong}


def _drive(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from pytest_sharedkv.stack.checks.transfer_provider import (
        Client,
        block_plan,
        make_kv,
        missing_api,
        page,
    )

    missing = missing_api()
    if missing:
        return {"unsupported": missing}
    ops = json.loads(args.ops)
    client = Client(args.url, MODEL)
    results: dict[str, dict[str, Any]] = {}
    try:
        kv = make_kv(int(ops[0].get("seed", SEED_B)))
        client.register(kv)
        for op in ops:
            salt = "" if args.salt_blind else op["salt"]  # the planted fault drops it
            if op["op"] == "store":
                a_ids, _ = block_plan()
                stored = client.store(f"sharedkv-identity-{op['name']}", a_ids, salt)
                hit, _ = client.wait_visible(f"sharedkv-identity-{op['name']}-visible", salt,
                                             time.monotonic() + 60)
                pages = torch.stack([torch.stack([page(t, b).cpu() for b in a_ids])
                                     for t in kv.values()])
                torch.save(pages, args.workdir / f"pages-{op['name']}.pt")
                results[op["name"]] = {"stored": stored, "hit": hit, "chunk": client.chunk}
            elif op["op"] == "lookup":
                rid = f"sharedkv-identity-{op['name']}"
                hit = client.lookup(rid, salt)
                client.release(rid, hit, salt)
                results[op["name"]] = {"hit": hit, "chunk": client.chunk}
            else:
                results[op["name"]] = {**_fetch(client, kv, op, salt, args.workdir),
                                       "chunk": client.chunk}
    finally:
        client.close()
    import lmcache

    return {"ops": results, "lmcache": str(getattr(lmcache, "__version__", "?"))}


def main(argv: list[str] | None = None) -> int:
    from pytest_sharedkv.stack.checks.transfer_provider import _wait_for

    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--ops", required=True, help="JSON list of store/lookup/fetch ops")
    parser.add_argument("--after", type=Path, default=None)
    parser.add_argument("--salt-blind", action="store_true",
                        help="a planted fault: every call drops its cache_salt, as LMCache "
                        "#4825's SGLang path does")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (the slow imports overlap the server's start)

    if args.after is not None:
        _wait_for(args.after, 300)
    result = _drive(args)
    out = args.workdir / f"{args.name}.json"
    partial = out.with_suffix(".json.partial")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
