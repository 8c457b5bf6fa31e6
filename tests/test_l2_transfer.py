"""The transfer check across hosts on CPU: LMCache servers that share an L2 (a real Redis
through ``resp``, a directory through ``fs``; ``fs_native`` under a ``fault_inject`` gap;
``valkey`` where its client is installed) move KV from a writer to readers that never saw
it, byte-exact and from L2 by the reader's own account; the controls (a reader without
L2, a byte flipped in L2, a gap) each come out as they must.

The servers start once per run, whichever xdist worker needs them first (a file lock: the
other worker reads the same results), and stop before any test reads them: five LMCache
servers (six with valkey) and two replica processes, about 40 s of CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from pytest_sharedkv.stack.checks import l2_transfer
from pytest_sharedkv.stack.checks.l2_transfer import KEYS, HostCase, judge
from pytest_sharedkv.stack.checks.transfer_provider import CHUNK, NUM_TOKENS
from pytest_sharedkv.stack.l2 import backends as l2
from pytest_sharedkv.stack.l2.log import KeySplit
from tests.conftest import isolate, run_directory

REQUIRE_REDIS_ENV = "SHAREDKV_REQUIRE_REDIS"  # CI: a missing redis-server fails, not skips
GAP = 4


def _start_all(work: Path) -> dict[str, Any]:
    """Every L2, server and case of the check; the outcomes and what was unavailable."""
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    unavailable: dict[str, str] = {}
    backends: dict[str, l2.L2] = {"fs": l2.DirectoryL2(work / "fs", "fs"),
                                  "fs_native": l2.DirectoryL2(work / "fs_native", "fs_native")}
    for name in ("resp", "valkey"):
        try:
            backends[name] = l2.suite_redis(work, name)
        except l2.L2Unavailable as exc:
            unavailable[name] = str(exc)
    started: list[l2.L2] = []
    servers: list[LMCacheServer] = []
    try:
        for name, backend in list(backends.items()):
            try:
                backend.start()
                started.append(backend)
            except l2.L2Unavailable as exc:
                unavailable[name] = str(exc)
                backends.pop(name)
                backend.stop()

        def server(*adapters: str) -> LMCacheServer:
            made = LMCacheServer(ServerConfig(l1_size_gb=0.25, chunk_size=CHUNK,
                                              l2_adapters=adapters), work, env=env)
            servers.append(made)
            return made

        writer = server(*(b.adapter_json() for b in backends.values()))
        readers = {name: server(b.adapter_json()) for name, b in backends.items()
                   if name != "fs_native"}
        gap = server(json.dumps(l2.fault_inject(backends["fs_native"], (GAP,))))
        control = server()
        for each in servers:
            each.launch()
        for each in servers:
            each.wait_ready()
        cases = [HostCase(name, reader, backends[name]) for name, reader in readers.items()]
        cases += [HostCase(f"{name}-corrupt", readers[name], backends[name], "corrupt")
                  for name in ("fs", "resp") if name in readers]
        cases += [HostCase("fs_native-gap", gap, backends["fs_native"], "gap"),
                  HostCase("no-l2", control, None)]
        (work / "run").mkdir()
        outcomes = l2_transfer.run_across_hosts(work / "run", writer, cases,
                                                f"l2-{uuid.uuid4().hex[:8]}")
        return {"cases": {name: o.as_dict() for name, o in outcomes.items()},
                "unavailable": unavailable,
                "startup_s": {s.process.name + f" {s.url}": s.startup_s for s in servers}}
    finally:
        for each in servers:
            each.stop()
        for backend in started:
            backend.stop()


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
          ) -> dict[str, Any]:
    """The check's results, computed once per run (by whichever worker comes first)."""
    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache is not installed")
    root = run_directory(pytestconfig, tmp_path_factory)
    results = root / "l2-hosts.json"
    with FileLock(str(root / "l2-hosts.lock")):
        if not results.exists():
            with pytest.MonkeyPatch.context() as monkeypatch:
                isolate(monkeypatch, pytestconfig, tmp_path_factory)
                work = Path(tmp_path_factory.mktemp("l2-hosts"))
                results.write_text(json.dumps(_start_all(work), indent=1))
    return dict(json.loads(results.read_text()))


def _case(hosts: dict[str, Any], name: str) -> dict[str, Any]:
    backend = name.split("-")[0]
    if name not in hosts["cases"]:
        reason = hosts["unavailable"].get(backend, f"no case {name}")
        if backend == "resp" and os.environ.get(REQUIRE_REDIS_ENV):
            pytest.fail(f"{REQUIRE_REDIS_ENV} is set: {reason}")
        pytest.skip(reason)
    case: dict[str, Any] = hosts["cases"][name]
    return case


@pytest.mark.parametrize("name", ["resp", "fs", "valkey"])
def test_kv_crosses_hosts_through_the_l2(hosts: dict[str, Any], name: str) -> None:
    case = _case(hosts, name)
    assert (case["kind"], case["status"]) == ("l2-transfer", "pass"), case
    assert case["hit_tokens"] == NUM_TOKENS
    assert case["split"] == {"request_id": f"sharedkv-b-fetch-{name}", "retained": KEYS,
                             "requested": KEYS, "l1": 0, "l2": KEYS}
    assert case["l2_visible_s"] is not None and case["l2_visible_s"] >= 0


@pytest.mark.parametrize("name", ["resp-corrupt", "fs-corrupt"])
def test_a_byte_flipped_in_the_l2_is_caught_by_the_compare(hosts: dict[str, Any],
                                                           name: str) -> None:
    case = _case(hosts, name)
    assert case["planted"] and "byte" in case["planted"], case
    assert (case["kind"], case["status"]) == ("l2-transfer", "pass"), case


def test_a_gap_in_l2_trims_the_lookup_to_the_prefix_before_it(hosts: dict[str, Any]) -> None:
    case = _case(hosts, "fs_native-gap")
    assert (case["kind"], case["status"]) == ("l2-transfer", "pass"), case
    assert case["hit_tokens"] == GAP * CHUNK
    assert (case["split"]["retained"], case["split"]["l1"], case["split"]["l2"]) == (GAP, 0, GAP)


def test_a_reader_without_l2_hits_nothing(hosts: dict[str, Any]) -> None:
    case = _case(hosts, "no-l2")
    assert (case["kind"], case["status"], case["hit_tokens"]) == ("l2-transfer", "pass", 0), case


# Lines LMCache 0.5.6's server logged on this host with its Redis down: it answered / with
# {"status":"ok"} and its lookups got no answer in 30 s.
REDIS_DOWN_LOG = """\
[2026-12-02 09:23:55,776] LMCache INFO: Created RESP L2 adapter: 127.0.0.1:{port} (workers=8) \
(resp_l2_adapter.py:163:lmcache.v1.distributed.l2_adapters.resp_l2_adapter)
[LMCache Connector Worker Error] connection failed
[LMCache Connector Worker Error] connection failed
[2026-12-02 09:23:55,827] LMCache INFO: LMCache zmq cache server is running on 127.0.0.1:15012
INFO:     Application startup complete.
"""


@pytest.mark.parametrize(("down", "error"), [(True, True), (False, False)])
def test_a_server_that_answers_ok_without_its_redis_is_an_error(tmp_path: Path, down: bool,
                                                               error: bool) -> None:
    from pytest_sharedkv.stack.lmcache_server import L2NotAttached, LMCacheServer, ServerConfig

    adapter = json.dumps({"type": "resp", "host": "127.0.0.1", "port": 6390})
    server = LMCacheServer(ServerConfig(l2_adapters=(adapter,)), tmp_path)
    server.process.alive = lambda: True  # type: ignore[method-assign]
    server._ready = lambda: True  # type: ignore[method-assign]
    log = REDIS_DOWN_LOG.format(port=6390)
    if not down:
        log = "\n".join(line for line in log.splitlines() if "Worker Error" not in line)
    server.process.log_path.write_text(log)
    if not error:
        server.wait_ready()
        return
    with pytest.raises(L2NotAttached) as caught:
        server.wait_ready()
    assert str(caught.value) == (
        f"lmcache server (mixed) on {server.url} started without its L2: its log says "
        f"'[LMCache Connector Worker Error] connection failed' (log: {server.process.log_path})")


# The judge alone, on what B reported: each way a fetch can be wrong fails, naming it.
def _reader(adapters: tuple[str, ...] = ()) -> Any:
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    server = LMCacheServer.__new__(LMCacheServer)
    server.config = ServerConfig(l2_adapters=adapters)
    server.port = 1
    return server


FS = l2.DirectoryL2(Path("/l2"), "fs")
GOOD = {"hit_tokens": NUM_TOKENS, "control_hit_tokens": 0, "retrieved": True,
        "pages_compared": 256, "mismatched_pages": 0, "untouched_pages_changed": 0,
        "mismatches": []}
FROM_L2 = KeySplit("r", KEYS, KEYS, 0, KEYS)


@pytest.mark.parametrize(("fault", "fetch", "split", "kinds"), [
    ("none", GOOD, FROM_L2, []),
    ("none", GOOD, KeySplit("r", KEYS, KEYS, KEYS, 0), ["source"]),  # from its own L1
    ("none", GOOD, KeySplit("r", KEYS, KEYS, 3, 5), ["source"]),
    ("none", GOOD, KeySplit("r"), ["source"]),  # the server logged no split: unknown
    ("none", {**GOOD, "hit_tokens": 1024}, KeySplit("r", 4, KEYS, 0, 4), ["hits"]),
    ("none", {**GOOD, "mismatched_pages": 2, "mismatches": ["layer 0"]}, FROM_L2, ["bytes"]),
    ("none", {**GOOD, "untouched_pages_changed": 1}, FROM_L2, ["bytes"]),
    ("none", {**GOOD, "control_hit_tokens": 256}, FROM_L2, ["leak"]),
    ("none", {**GOOD, "retrieved": False}, FROM_L2, ["hits"]),
    ("corrupt", {**GOOD, "mismatched_pages": 1}, FROM_L2, []),
    ("corrupt", GOOD, FROM_L2, ["bytes"]),  # the planted byte went unseen
    ("gap", {**GOOD, "hit_tokens": GAP * CHUNK}, KeySplit("r", GAP, KEYS, 0, GAP), []),
    ("gap", GOOD, FROM_L2, ["hits"]),  # a hit past the gap
])
def test_the_judge_names_what_is_wrong(fault: str, fetch: dict[str, Any], split: KeySplit,
                                       kinds: list[str]) -> None:
    adapters = (json.dumps(l2.fault_inject(FS, (GAP,))),) if fault == "gap" else ()
    case = HostCase("c", _reader(adapters), FS, fault)
    assert [p.kind for p in judge(case, fetch, split)] == kinds


@pytest.mark.parametrize(("hit", "kinds"), [(0, []), (2048, ["hits"])])
def test_a_reader_without_l2_must_not_hit(hit: int, kinds: list[str]) -> None:
    case = HostCase("c", _reader(), None)
    assert [p.kind for p in judge(case, {**GOOD, "hit_tokens": hit}, KeySplit("r"))] == kinds


class _Partial(l2.DirectoryL2):
    """An L2 that never gets more than 5 of a salt's keys."""

    def entries(self, salt: str) -> list[str] | None:
        return [f"k{i}@{salt}.data" for i in range(5)]


def test_the_l2_wait_ends_at_its_deadline_naming_the_keys_missing(tmp_path: Path) -> None:
    (tmp_path / l2_transfer.STORED).write_text(json.dumps({"s-c": 1.0}))
    case = HostCase("c", _reader(), _Partial(tmp_path, "fs"))
    seen, stored = l2_transfer.wait_l2([case], {"c": "s-c"}, lambda: True, tmp_path,
                                       deadline_s=0.05, timeout=5)
    assert seen == {} and stored == {"s-c": 1.0}
    problem = l2_transfer.missing_in_l2(case, "s-c", 0.05)
    assert problem.kind == "l2"
    assert f"held 5 of the {KEYS} entries of salt s-c 0.05s after the store" in problem.message
    whole = HostCase("c", _reader(), l2.DirectoryL2(tmp_path, "fs"))
    for i in range(KEYS):
        (tmp_path / f"k{i}@s-c.data").write_bytes(b"x")
    seen, _ = l2_transfer.wait_l2([whole], {"c": "s-c"}, lambda: True, tmp_path,
                                  deadline_s=0.05, timeout=5)
    assert list(seen) == ["c"]


def test_a_reader_that_never_answers_fails_its_case_alone(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """A server whose Redis is down answers ``/`` ok and never answers a lookup (seen: no
    answer in 30 s): that case fails, B goes on to the next reader."""
    from pytest_sharedkv.stack.checks import transfer_provider

    class Client:
        def __init__(self, url: str, model: str) -> None:
            self.url = url

        def close(self) -> None:
            pass

    def fetch_role(client: Client, workdir: Path, salt: str, device: str,
                   tag: str = "") -> dict[str, Any]:
        if client.url == "tcp://dead":
            raise TimeoutError("lookup sharedkv-b-control-x got no answer in 30.0s")
        return {"hit_tokens": NUM_TOKENS}

    monkeypatch.setattr(transfer_provider, "Client", Client)
    monkeypatch.setattr(transfer_provider, "fetch_role", fetch_role)
    jobs = l2_transfer.fetch_jobs("m", tmp_path, [["x", "tcp://dead", "s1"],
                                                  ["y", "tcp://ok", "s2"]])["jobs"]
    assert jobs["x"]["error"] == "TimeoutError: lookup sharedkv-b-control-x got no answer in 30.0s"
    assert jobs["y"]["hit_tokens"] == NUM_TOKENS
