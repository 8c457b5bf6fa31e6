"""A port in use for the suite's own Redis (--sharedkv-l2 resp|valkey): the port it
picked was free when picked, so one taken before Redis listened is a race with another
process; the suite picks another, three ports in all, and only then fails every test that
needs the L2 with a message naming the option and the ports, never a traceback, no
process left. A port the user named (an existing L2) is never changed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_sharedkv.processes.managed import free_port
from pytest_sharedkv.stack.l2 import backends as l2
from pytest_sharedkv.stack.l2 import redis_server
from tests.conftest import keep_loaded

keep_loaded("redis", "redis.backoff", "redis.retry")
BINARY = redis_server.find_redis_server()
REDIS_MISSING = redis_server.missing()  # no redis-server, or no redis-py
needs_redis = pytest.mark.skipif(REDIS_MISSING is not None, reason=str(REDIS_MISSING))


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@needs_redis
def test_a_picked_port_taken_before_redis_listens_is_replaced(
        tmp_path: Path, taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = iter([taken, free_port()])
    monkeypatch.setattr(redis_server, "free_port", lambda: next(ports))
    backend = l2.suite_redis(tmp_path)
    assert backend.port == taken
    try:
        backend.start()
        assert backend.port != taken and backend.server is not None
        assert backend.server.port == backend.port
        assert redis_server.ping(backend.host, backend.port) is None
        assert str(backend.port) in backend.adapter_json()  # what the servers are given
    finally:
        assert backend.stop() == []


@needs_redis
def test_ports_taken_every_time_are_named(tmp_path: Path, taken: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_server, "free_port", lambda: taken)
    backend = l2.suite_redis(tmp_path)
    with pytest.raises(l2.L2Unavailable) as caught:
        backend.start()
    assert caught.value.problem.kind == "port-in-use"
    assert caught.value.problem.message == (
        f"port {taken} on 127.0.0.1 is in use: the suite's Redis cannot listen there (the "
        f"suite picked {l2.PORT_TRIES} free ports, {', '.join([str(taken)] * l2.PORT_TRIES)},"
        " and each was taken before its Redis listened there)")


@needs_redis
def test_a_port_the_caller_named_is_kept(tmp_path: Path, taken: int) -> None:
    backend = l2.suite_redis(tmp_path, port=taken)
    with pytest.raises(l2.L2Unavailable, match=f"port {taken} on 127.0.0.1 is in use: the "
                       "suite's Redis cannot listen there$"):
        backend.start()
    assert backend.port == taken


@needs_redis
def test_every_test_that_needs_the_l2_fails_naming_the_option(
        pytester: pytest.Pytester, taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_server, "free_port", lambda: taken)
    pytester.makepyfile("def test_x(sharedkv_l2): pass\n"
                        "def test_y(sharedkv_l2): pass\n"
                        "def test_z(): pass\n")
    result = pytester.runpytest_inprocess("--sharedkv-provider=stub",
                                          "--sharedkv-topology=hosts", "--sharedkv-l2=resp")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([f"*--sharedkv-l2 resp: port {taken} on 127.0.0.1 is in use:"
                                 " the suite's Redis cannot listen there (the suite picked 3 "
                                 "free ports*"] * 2)
    assert "Traceback" not in result.stdout.str()
