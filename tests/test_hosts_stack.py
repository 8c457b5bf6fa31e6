"""The hosts topology's stack pieces (stack/topology.py, the L2's chunks, the server's split
by request id, the L1 eviction counter, the launched pair across hosts, the stub double's
hosts mode): each on its own, the stubs served in-process, the launched pair with fake
servers. The suite-level runs are tests/test_hosts_service.py's."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.stack.l2 import backends as l2
from pytest_sharedkv.stack.l2 import log as l2_log
from pytest_sharedkv.stack.l2 import redis_server
from pytest_sharedkv.stack.launch.spec import LaunchSpec
from pytest_sharedkv.stack.stub import stub_openai as stub
from pytest_sharedkv.stack.topology import HostsSpec, ServerView, Topology, l1_evictions

REDIS_MISSING = redis_server.missing()  # no redis-server, or no redis-py
COPY_PROMPT = " ".join(f"w{i % 100:02d}" for i in range(200))  # 6 chunks of 32 to look up
CHUNKS = 200 // 32


# -- the L2's chunks ------------------------------------------------------------------

def test_an_l2_holds_whole_chunks_by_every_rank_and_group() -> None:
    entries = [f"m@0x00000001@{g}@{h}@s.data" for h in ("aa", "bb") for g in (0, 1)]
    held = l2.held_of([*entries, "m@0x00000001@0@cc@s.data", "stray-file"])
    assert (held.entries, held.chunks, held.whole, held.parts) == (6, 3, 2, 2)
    assert held.describe() == "2 whole chunk(s) of 3 seen (6 entries, 2 per chunk)"
    assert l2.entry_fields("m@00000001@0@aa@s") == ("00000001", "0", "aa")  # RESP keys
    assert l2.entry_fields("no-at-signs") is None


def test_a_directory_l2_writes_whole_entries_and_reads_them_back(tmp_path: Path) -> None:
    backend = l2.DirectoryL2(tmp_path / "l2")
    backend.start()
    backend.write("m@0x0@0@aa@s.data", b"bytes")
    assert backend.read("m@0x0@0@aa@s.data") == b"bytes"
    assert backend.read("m@0x0@0@bb@s.data") is None
    assert not list(backend.path.glob("*.tmp"))
    held = backend.held("s")
    assert held is not None and held.whole == 1


@pytest.mark.skipif(REDIS_MISSING is not None, reason=str(REDIS_MISSING))
def test_a_redis_at_its_memory_limit_refuses_a_write(tmp_path: Path) -> None:
    """What the failed-write cell stands on: a Redis at maxmemory (noeviction) refuses."""
    import redis

    backend = l2.suite_redis(tmp_path, maxmemory=8 << 20)
    backend.start()
    try:
        backend.write("m@0@0@aa@s", b"x" * 100)
        assert backend.read("m@0@0@aa@s") == b"x" * 100
        with pytest.raises(redis.RedisError, match="maxmemory"):
            backend.write("m@0@0@bb@s", b"x" * (16 << 20))
    finally:
        assert backend.stop() == []


@pytest.mark.parametrize(("value", "stub", "kind"), [
    ("fs", False, None),
    ('{"type": "fs", "base_path": "/no/such/dir"}', False, "not-writable"),
    ('{"type": "resp", "host": "127.0.0.1", "port": 1}', False, "unreachable"),
    ('{"type": "mooncake_store"}', True, "bad-spec"),
])
def test_what_the_l2_needs_is_known_before_anything_starts(
        value: str, stub: bool, kind: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(l2, "_lmcache_dir", lambda: None)  # the stub needs no LMCache
    problem = l2.configure_problem(value, stub=stub)
    assert (problem.kind if problem else None) == kind, problem


def test_valkey_without_its_client_or_redis_without_a_binary_is_known(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(l2, "adapter_problem", lambda t, lmcache=None: l2.L2Problem(
        "adapter-missing", f"no {t}"))
    monkeypatch.setattr(l2, "_lmcache_dir", lambda: Path("/lmcache"))
    monkeypatch.setattr(redis_server, "find_redis_server", lambda path=None: Path("/r"))
    assert l2.configure_problem("valkey") == l2.L2Problem("adapter-missing", "no valkey")
    monkeypatch.setattr(redis_server, "find_redis_server", lambda path=None: None)
    assert l2.configure_problem("resp") == l2.L2Problem("redis-missing", redis_server.MISSING)


def test_a_fault_inject_adapter_is_read_as_its_inner_l2_and_its_gaps() -> None:
    spec = l2.fault_inject(l2.DirectoryL2(Path("/kv"), "fs"), (4,))
    backend, gaps = l2.parse_adapter(spec)
    assert isinstance(backend, l2.DirectoryL2) and backend.path == Path("/kv")
    assert gaps == (4,)


# -- the server's own account: the split by request id, the evictions --------------------

def test_a_lookup_is_found_by_the_x_request_id_under_vllms_engine_id() -> None:
    """vLLM names the engine request cmpl-<X-Request-Id>-<n>-<suffix>, and LMCache's
    connector looks up under that id; the suite finds it by the tag it sent."""
    tag = "sharedkv.3k-000.cross.B"
    log = "\n".join([
        l2_log.retained_line(8, 8, 8, 0, f"cmpl-{tag}-0-aaaa1111", 1),  # an earlier lookup
        l2_log.retained_line(8, 8, 0, 8, f"cmpl-{tag}-0-bbbb2222", 2),
        l2_log.retained_line(4, 8, 0, 4, "cmpl-sharedkv.3k-001.cross.B-0-cccc3333", 3),
    ])
    assert l2_log.split_for_tag(log, tag).as_dict() == {
        "request_id": tag, "retained": 8, "requested": 8, "l1": 0, "l2": 8}
    found = l2_log.splits_by_tag(log)
    assert found[("3k-000", "cross", "B")].l2 == 8
    assert found[("3k-001", "cross", "B")].describe() == "4/8 retained keys (0 L1, 4 L2)"
    assert not l2_log.split_for_tag(log, "sharedkv.3k-002.cross.B").known


# What LMCache 0.5.6's server served on GET /metrics on this host with observability on
# (count_evictions), an L1 of 0.001 GB after three 2048-token stores.
SERVED_METRICS = """\
# HELP lmcache_mp_l1_write_chunks_total Total chunks written to L1
# TYPE lmcache_mp_l1_write_chunks_total counter
lmcache_mp_l1_write_chunks_total{cache_salt="s0",l1_tag="_default"} 8.0
lmcache_mp_l1_write_chunks_total{cache_salt="s1",l1_tag="_default"} 8.0
# HELP lmcache_mp_l1_evicted_chunks_total Total chunks evicted from L1
# TYPE lmcache_mp_l1_evicted_chunks_total counter
lmcache_mp_l1_evicted_chunks_total{cache_salt="s0",l1_tag="_default"} 3.0
"""


def test_the_l1_evictions_are_the_servers_own_counter_and_unknown_is_not_zero() -> None:
    assert l1_evictions(SERVED_METRICS) == 3
    written_only = "\n".join(line for line in SERVED_METRICS.splitlines() if "evict" not in line)
    assert l1_evictions(written_only) == 0  # it counted writes and no eviction
    assert l1_evictions("") is None  # it counted nothing: unknown
    server = ServerView("server", lambda: "", ("http://127.0.0.1:1/metrics",))
    assert server.evictions() is None  # the scrape failed: unknown, not 0


def test_a_server_counts_evictions_only_where_asked(tmp_path: Path) -> None:
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    plain = LMCacheServer(ServerConfig(), tmp_path).process.argv
    counting = LMCacheServer(ServerConfig(count_evictions=True), tmp_path, role="2")
    assert "--disable-observability" in plain
    assert "--disable-observability" not in counting.process.argv
    assert counting.process.name == "lmcache server 2 (mixed)"
    assert counting.metrics_url == f"{counting.http_url}/metrics"


class _Partial(l2.DirectoryL2):
    def entries(self, salt: str) -> list[str] | None:
        return [f"m@0x0@0@{i:02x}@{salt}.data" for i in range(3)]


class _Growing(l2.DirectoryL2):
    """An L2 whose writes land one poll after another: 2 chunks, then 5."""

    polls = 0

    def entries(self, salt: str) -> list[str] | None:
        self.polls += 1
        return [f"m@0x0@0@{i:02x}@{salt}.data" for i in range(2 if self.polls < 3 else 5)]


def test_the_wait_for_the_l2_polls_until_it_holds_what_b_asks_for(tmp_path: Path) -> None:
    growing = _Growing(tmp_path, "fs")
    wait = Topology("hosts", (), l2=growing).wait_l2({"s": 5}, tokens=0)
    assert wait.listed and wait.missing == () and growing.polls == 3


def test_the_wait_for_the_l2_names_what_was_missing(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_sharedkv.stack import topology

    monkeypatch.setattr(topology, "L2_DEADLINE_S", 0.05)
    hosts = Topology("hosts", (), l2=_Partial(tmp_path, "fs"))
    wait = hosts.wait_l2({"s1": 3, "s2": 5}, tokens=0)
    assert wait.listed and len(wait.missing) == 2
    assert wait.missing[0].startswith(f"fs -> {tmp_path} held 0 entries ")
    assert wait.missing[0].endswith("; 1 of 2 salts short")
    assert wait.missing[1] == ("salt s2: 3 whole chunk(s) of 3 seen (3 entries, 1 per chunk) "
                               "of the 5 chunk(s) B asks for")
    assert not Topology("hosts", (), l2=l2.OtherL2({"type": "p2p"})).wait_l2(
        {"s": 1}, 0).listed  # cannot be listed: the settle stands in for it


# -- the stub double across hosts ----------------------------------------------------

@contextmanager
def stub_host(name: str, pool: Path, adapter: dict[str, Any], *extra: str
              ) -> Iterator[tuple[str, stub._State]]:
    args = stub.parse_args(["--port", "0", "--name", name, "--pool", str(pool),
                            "--l2-adapter", json.dumps(adapter), *extra])
    pool.mkdir(parents=True, exist_ok=True)
    state = stub._State(args)
    server = stub._Server(("127.0.0.1", 0), stub.make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, tag: str, salt: str = "s") -> dict[str, Any]:
    body = {"prompt": COPY_PROMPT, "max_tokens": 4, "cache_salt": salt}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "X-Request-Id": tag})
    with urllib.request.urlopen(request, timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def _cached(data: dict[str, Any]) -> int:
    return int(data["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_the_stub_across_hosts_serves_b_from_the_l2_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    adapter = {"type": "fs", "base_path": str(tmp_path / "l2")}
    (tmp_path / "l2").mkdir()
    with stub_host("A", tmp_path / "l1-A", adapter) as (a, _), \
            stub_host("B", tmp_path / "l1-B", adapter) as (b, b_state):
        cold = _post(a, "sharedkv.c.cold.A")
        assert _cached(cold) == 0
        held = l2.DirectoryL2(tmp_path / "l2").held("s")
        assert held is not None and held.whole == CHUNKS  # A wrote every chunk to the L2
        cross = _post(b, "sharedkv.c.cross.B")
        assert _cached(cross) == CHUNKS * 32
        assert cross["choices"][0]["text"] == cold["choices"][0]["text"]
        again = _post(b, "sharedkv.c.receiver-local.B")  # its engine's own cache now
        assert _cached(again) == CHUNKS * 32
        with urllib.request.urlopen(b + "/server/metrics", timeout=5) as response:
            assert l1_evictions(response.read().decode()) == 0
        assert b_state.l1_writes == CHUNKS  # what B's server took from the L2
    log = capsys.readouterr().out
    split = l2_log.split_for_tag(log, "sharedkv.c.cross.B")
    assert (split.retained, split.l1, split.l2) == (CHUNKS, 0, CHUNKS)


def test_a_gap_in_the_stubs_l2_stops_the_lookup_before_it_and_the_answer_stays_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inner = {"type": "fs", "base_path": str(tmp_path / "l2")}
    (tmp_path / "l2").mkdir()
    gap = l2.fault_inject(l2.existing(inner), (2,))
    with stub_host("A", tmp_path / "l1-A", inner) as (a, _), \
            stub_host("B", tmp_path / "l1-B", gap) as (b, _):
        cold = _post(a, "sharedkv.c.cold.A")
        cross = _post(b, "sharedkv.c.cross.B")
        assert _cached(cross) == 2 * 32  # the chunks before the gap, the rest recomputed
        assert cross["choices"][0]["text"] == cold["choices"][0]["text"]
    split = l2_log.split_for_tag(capsys.readouterr().out, "sharedkv.c.cross.B")
    assert (split.retained, split.l1, split.l2) == (2, 0, 2)


def test_a_byte_changed_in_the_stubs_l2_reaches_the_answer(tmp_path: Path) -> None:
    adapter = {"type": "fs", "base_path": str(tmp_path / "l2")}
    (tmp_path / "l2").mkdir()
    with stub_host("A", tmp_path / "l1-A", adapter, "--l2-flip-chunk", "3") as (a, _), \
            stub_host("B", tmp_path / "l1-B", adapter) as (b, _):
        cold = _post(a, "sharedkv.c.cold.A")
        cross = _post(b, "sharedkv.c.cross.B")
        assert _cached(cross) == CHUNKS * 32
        assert cross["choices"][0]["text"] != cold["choices"][0]["text"]


def test_a_small_l1_evicts_and_counts_it(tmp_path: Path) -> None:
    adapter = {"type": "fs", "base_path": str(tmp_path / "l2")}
    (tmp_path / "l2").mkdir()
    with stub_host("A", tmp_path / "l1-A", adapter, "--pool-blocks", "4") as (a, state):
        _post(a, "sharedkv.c.cold.A")
        _post(a, "sharedkv.d.cold.A", salt="t")
        assert state.evicted == 2 * CHUNKS - 4
        with urllib.request.urlopen(a + "/server/metrics", timeout=5) as response:
            assert l1_evictions(response.read().decode()) == 2 * CHUNKS - 4


@pytest.mark.skipif(REDIS_MISSING is not None, reason=str(REDIS_MISSING))
def test_a_write_the_stubs_l2_refuses_is_logged_and_b_recomputes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = l2.suite_redis(tmp_path, maxmemory=1)  # below what Redis itself uses: every write
    full.start()
    try:
        with stub_host("A", tmp_path / "l1-A", full.adapter()) as (a, _), \
                stub_host("B", tmp_path / "l1-B", full.adapter()) as (b, _):
            cold = _post(a, "sharedkv.c.cold.A")
            cross = _post(b, "sharedkv.c.cross.B")
            assert _cached(cross) == 0 and cross["choices"][0]["text"] == cold["choices"][0][
                "text"]
    finally:
        assert full.stop() == []
    assert "L2 store failed" in capsys.readouterr().out


def test_the_stub_pair_across_hosts_is_refused_when_a_server_lacks_its_l2(
        tmp_path: Path) -> None:
    from pytest_sharedkv.stack.faults import StubFaults
    from pytest_sharedkv.stack.launch.providers import stub_pair
    from pytest_sharedkv.stack.launch.spec import LaunchSpec
    from pytest_sharedkv.stack.lmcache_server import L2NotAttached

    backend = l2.DirectoryL2(tmp_path / "l2")
    backend.start()
    hosts = HostsSpec(backend.adapter_json(), backend.describe())
    spec = LaunchSpec(tmp_path, hosts=hosts, count_evictions=True, l1_size_gb=0.001,
                      stub_faults=StubFaults(l2_unattached=True))
    with pytest.raises(L2NotAttached) as caught:
        stub_pair(spec)
    assert str(caught.value).startswith("stub replica B's server started without its L2: its "
                                        "log says '[LMCache Connector Worker Error] "
                                        "connection failed'")


def test_the_stub_pair_across_hosts_is_recorded_as_such(tmp_path: Path) -> None:
    from pytest_sharedkv.stack.launch.providers import stub_pair
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    backend = l2.DirectoryL2(tmp_path / "l2")
    backend.start()
    spec = LaunchSpec(tmp_path, chunk_size=32, hosts=HostsSpec(backend.adapter_json(),
                                                               backend.describe()),
                      count_evictions=True, l1_size_gb=0.001)
    pair = stub_pair(spec)
    try:
        assert pair.record.topology == "hosts" and pair.record.l2 == backend.describe()
        topology = pair.topology
        assert topology is not None and topology.hosts and topology.chunk == 32
        assert [s.name for s in topology.servers] == ["server 1", "server 2"]
        assert topology.evictions() == {"server 1": 0, "server 2": 0}
        assert isinstance(topology.l2, l2.DirectoryL2) and topology.l2.path == backend.path
        argv = {p["name"]: p["argv"] for p in pair.launches}
        pools = [a[a.index("--pool") + 1] for a in argv.values()]
        assert pools == [str(tmp_path / "stub-l1-A"), str(tmp_path / "stub-l1-B")]
        assert all(a[a.index("--pool-blocks") + 1] == "32" for a in argv.values())
    finally:
        assert pair.close() == []


def test_the_launched_pair_across_hosts_connects_each_replica_to_its_own_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_sharedkv.stack.launch import providers
    from tests.test_launcher import _FakeServer

    ports = iter((5001, 5002))

    class Server(_FakeServer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.port = next(ports)

    monkeypatch.setattr(_FakeServer, "stopped", [])
    monkeypatch.setattr(providers, "LMCacheServer", Server)
    monkeypatch.setattr(providers, "start_all", lambda pair, together=False: None)
    adapter = json.dumps({"type": "fs", "base_path": str(tmp_path / "l2")})
    pair = providers.launch_vllm_pair(LaunchSpec(
        tmp_path, model=tmp_path, devices=("GPU-a", "GPU-b"), count_evictions=True,
        l1_size_gb=0.5, hosts=HostsSpec(adapter, "fs -> l2")))
    record = pair.record
    assert (record.topology, record.l2) == ("hosts", "fs -> l2")
    assert [s.l2_adapters for s in record.host_servers] == [(adapter,), (adapter,)]
    assert [s.l1_size_gb for s in record.host_servers] == [0.5, 0.5]
    assert record.topology_record()["servers"][0]["counts_evictions"] is True
    names = [p["name"] for p in pair.launches]
    assert names[:2] == ["lmcache server 1 (mixed)", "lmcache server 2 (mixed)"]
    for name, port in (("A", 5001), ("B", 5002)):
        process = pair[name].process
        assert process is not None
        argv = process.argv
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector_extra_config"]["lmcache.mp.port"] == port, name
    assert pair.topology is not None and pair.topology.server_of("B").name == "server 2"
    assert pair.close() == [] and Server.stopped == ["server", "server"]


def test_a_host_without_the_metrics_exporter_launches_servers_that_count_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LMCache 0.5.6 exits at start (status 3) when observability is on and the Prometheus
    exporter is missing (seen on the H200 host): the servers then launch without counting,
    and the evictions are unknown with the reason, never 0 and never a failed launch."""
    from pytest_sharedkv.service.summary import evictions_line
    from pytest_sharedkv.stack import lmcache_server
    from pytest_sharedkv.stack.launch import providers

    monkeypatch.setattr(lmcache_server, "eviction_counting_problem",
                        lambda: "LMCache's eviction counter needs the PyPI package X")
    spec = LaunchSpec(tmp_path, model=tmp_path, devices=("GPU-a",),
                                count_evictions=True, l1_size_gb=0.5, hosts=HostsSpec(
                                    json.dumps({"type": "fs", "base_path": str(tmp_path)}),
                                    "fs -> l2"))
    servers = providers.lmcache_servers(spec)
    assert [(s.config.count_evictions, s.config.uncounted) for s in servers] == [
        (False, "LMCache's eviction counter needs the PyPI package X")] * 2
    assert all("--disable-observability" in s.process.argv for s in servers)
    record = {"topology": "hosts", "servers": [
        {"l1_size_gb": 0.5, "counts_evictions": False, "uncounted": s.config.uncounted}
        for s in servers]}
    line = evictions_line({"3k": {"server 1": None, "server 2": None}}, {}, record)
    assert line.endswith("server 1 unknown, server 2 unknown L1 chunks evicted (L1 0.5 GB "
                         "each); not counted: LMCache's eviction counter needs the PyPI "
                         "package X")
    monkeypatch.setattr(lmcache_server, "eviction_counting_problem", lambda: "")
    assert all(s.config.count_evictions for s in providers.lmcache_servers(spec))


def test_the_metrics_exporter_is_looked_up_not_imported() -> None:
    from pytest_sharedkv.stack.lmcache_server import METRICS_EXPORTER, eviction_counting_problem

    problem = eviction_counting_problem()
    try:
        import importlib.util

        present = importlib.util.find_spec(METRICS_EXPORTER) is not None
    except ImportError:
        present = False
    assert (problem == "") is present
