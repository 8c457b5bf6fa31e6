"""The transfer provider against LMCache versions whose client API differs: the known
differences of 0.5.3 (no ``dcp_size``, no ``layout_hints`` on register, no
``create_recorded_event``) are bridged; anything else it calls and a version lacks makes the
check VOID naming what is missing, never a replica's traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from pytest_sharedkv.stack.checks import transfer_provider as tp


def _fake_lmcache(monkeypatch: pytest.MonkeyPatch, *, drop: str = "") -> None:
    """LMCache's two client modules as 0.5.3 shapes them, less the name DROP."""
    adapter, groups = ModuleType(tp.ADAPTER_MODULE), ModuleType(tp.GROUPS_MODULE)
    for module_name, names in tp.API.items():
        module = adapter if module_name == tp.ADAPTER_MODULE else groups
        for name, methods in names.items():
            if name == drop:
                continue
            kept = {m: (lambda *a, **k: None) for m in methods if f"{name}.{m}" != drop}
            setattr(module, name, type(name, (), kept) if methods else (lambda *a, **k: []))
    monkeypatch.setitem(sys.modules, tp.ADAPTER_MODULE, adapter)
    monkeypatch.setitem(sys.modules, tp.GROUPS_MODULE, groups)


def test_the_installed_lmcache_has_everything_the_provider_calls() -> None:
    pytest.importorskip("lmcache")
    assert tp.missing_api() == []


@pytest.mark.parametrize("drop", ["LMCacheMPSchedulerAdapter.free_lookup_locks",
                                  "LoadStoreOp", "create_engine_group_infos_from_vllm"])
def test_a_missing_call_is_named(monkeypatch: pytest.MonkeyPatch, drop: str) -> None:
    _fake_lmcache(monkeypatch)
    assert tp.missing_api() == []
    _fake_lmcache(monkeypatch, drop=drop)
    missing = tp.missing_api()
    assert len(missing) == 1 and missing[0].endswith(drop)


def test_a_module_that_does_not_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_lmcache(monkeypatch)
    monkeypatch.setitem(sys.modules, tp.GROUPS_MODULE, None)  # import raises ImportError
    assert tp.missing_api() == [f"{tp.GROUPS_MODULE} (ModuleNotFoundError: import of "
                                f"{tp.GROUPS_MODULE} halted; None in sys.modules)"]


def test_a_replica_that_finds_the_api_incomplete_writes_why_and_no_client_starts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    monkeypatch.setattr(tp, "missing_api", lambda: ["LMCacheMPWorkerAdapter.shutdown"])
    monkeypatch.setattr(tp, "Client", None)  # calling it would raise: it must not be made
    assert tp.main(["store", "--url", "tcp://127.0.0.1:1", "--model", "m",
                    "--workdir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "store.json").read_text())
    assert result["unsupported"] == ["LMCacheMPWorkerAdapter.shutdown"]
    void = tp.unsupported_void(result)
    assert void.startswith(f"VOID: LMCache {result['lmcache']} lacks what the transfer "
                           "provider calls (LMCacheMPWorkerAdapter.shutdown)")
    outcome = tp.TransferOutcome(problems=[void], void=void)
    assert outcome.verdict() == ("bytes", "void") and outcome.score() == (0, 1)


class _Worker053:
    """0.5.3's worker adapter: register without layout_hints, no create_recorded_event."""

    def __init__(self) -> None:
        self.registered: dict[str, Any] = {}

    def register_kv_caches(self, kv_caches: Any, engine_group_infos: Any) -> None:
        self.registered = {"kv": kv_caches, "infos": engine_group_infos}


def test_0_5_3_register_and_event_are_bridged(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_lmcache(monkeypatch)
    calls: list[dict[str, Any]] = []

    def infos_053(config: Any, kv: Any, layout_hints: Any = None) -> list[str]:  # no dcp_size
        calls.append({"layout_hints": layout_hints})
        return ["group"]

    monkeypatch.setattr(sys.modules[tp.GROUPS_MODULE], "create_engine_group_infos_from_vllm",
                        infos_053)
    recorded: list[bool] = []

    class Event:
        def __init__(self, interprocess: bool) -> None:
            assert interprocess

        def record(self) -> None:
            recorded.append(True)

    fake_lmcache = ModuleType("lmcache")
    fake_lmcache.torch_dev = SimpleNamespace(Event=Event)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lmcache", fake_lmcache)
    client = object.__new__(tp.Client)
    client.worker = _Worker053()
    client.register({"layer.0": "kv"})
    assert client.worker.registered == {"kv": {"layer.0": "kv"}, "infos": ["group"]}
    assert calls == [{"layout_hints": {"kv_layout": "NHD"}}]
    assert isinstance(client.event(), Event) and recorded == [True]


def test_accepts_reads_the_signature() -> None:
    from pytest_sharedkv.host.lmcache_api import accepts

    assert accepts(_Worker053().register_kv_caches, "engine_group_infos")
    assert not accepts(_Worker053().register_kv_caches, "layout_hints")
    assert not accepts(len, "anything")  # a builtin without a readable signature


MANAGED, SERVER = "pytest_sharedkv.processes.managed", "pytest_sharedkv.stack.lmcache_server"


def _patch(monkeypatch: pytest.MonkeyPatch, process: type, server: type) -> None:
    """run_pair's process classes, patched where its imports find them: in sys.modules (an
    in-process inner run earlier in this process may have dropped a module's first import,
    leaving a stale one on its package)."""
    monkeypatch.setattr(sys.modules[MANAGED], "ManagedProcess", process)
    monkeypatch.setattr(sys.modules[SERVER], "LMCacheServer", server)


def test_a_replica_that_fails_to_start_leaves_nothing_running(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """B's start raising (the spawn failed): the check records it, and everything started
    before (the server, A) is stopped; B, never started, has no pid to clean up after."""
    from pytest_sharedkv.processes.managed import ManagedProcess, ProcessFailed
    from pytest_sharedkv.stack.lmcache_server import ServerConfig

    stopped: list[str] = []

    class Process(ManagedProcess):
        def start(self) -> None:
            if self.name.endswith("B"):
                raise ProcessFailed(f"{self.name}: could not be spawned")
            self.proc = SimpleNamespace(pid=4_000_000)  # type: ignore[assignment]

        def stop(self, grace: float = 10.0) -> list[int]:
            stopped.append(self.name)
            return []

    class Server:
        url = "tcp://127.0.0.1:1"

        def __init__(self, config: ServerConfig, log_dir: Path,
                     env: dict[str, str]) -> None:
            self.config = config

        def launch(self) -> None:
            stopped.append("(server launched)")

        def stop(self) -> list[int]:
            stopped.append("server")
            return []

    _patch(monkeypatch, Process, Server)
    outcome = tp.run_pair(tmp_path, "salt")
    assert stopped == ["(server launched)", "transfer replica A", "transfer replica B",
                       "server"]
    assert [type(p) for p in outcome.problems] == [tp.Failed]
    assert "transfer replica B: could not be spawned" in outcome.problems[0]
    assert outcome.verdict() == ("bytes", "fail") and outcome.score() == (0, 1)


def test_problems_are_scored_by_their_class_never_their_text() -> None:
    """Only wrong bytes are counted page by page: a process failure whose message happens
    to begin "wrong bytes" fails every page, and each judged problem carries its kind."""
    store = {"stored": True, "visible_hit_tokens": tp.NUM_TOKENS}
    fetch = {"hit_tokens": tp.NUM_TOKENS, "control_hit_tokens": 256, "retrieved": True,
             "pages_compared": 256, "mismatched_pages": 64, "untouched_pages_changed": 0,
             "mismatches": ["x"]}
    assert [type(p) for p in tp.judge(store, fetch)] == [tp.SaltLeak, tp.WrongBytes]
    assert [type(p) for p in tp.judge({}, {**fetch, "hit_tokens": 16, "retrieved": False,
                                           "control_hit_tokens": 0, "mismatched_pages": 0})
            ] == [tp.NotMoved, tp.NotMoved, tp.NotMoved]
    wrong = tp.WrongBytes("64 pages differ")
    assert tp.TransferOutcome(fetch=fetch, problems=[wrong]).score() == (192, 256)
    crashed = tp.Failed(f"{tp.BYTES_WRONG}: replica B exited with status 1")
    assert tp.TransferOutcome(fetch=fetch, problems=[crashed]).score() == (0, 256)
    assert tp.TransferOutcome(fetch=fetch, problems=[wrong, crashed]).score() == (0, 256)


def test_the_transfer_check_records_what_it_launched(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The server and both client processes, with the server's config; the clients serve
    nothing (no URL) and no engine was placed on a GPU."""
    from pytest_sharedkv.processes.managed import ManagedProcess
    from pytest_sharedkv.stack.lmcache_server import ServerConfig

    class Process(ManagedProcess):
        def start(self) -> None:
            self.proc = SimpleNamespace(pid=4_000_000)  # type: ignore[assignment]

        def wait_exit(self, timeout: float, what: str) -> int:
            return 0

        def stop(self, grace: float = 10.0) -> list[int]:
            return []

    class Server:
        url = "tcp://127.0.0.1:1"

        def __init__(self, config: ServerConfig, log_dir: Path,
                     env: dict[str, str]) -> None:
            self.config = config
            self.process = Process("lmcache server (mixed)", ["lmcache", "server"],
                                   log_dir / "server.log", env=env)

        def launch(self) -> None:
            pass

        def wait_ready(self) -> None:
            pass

        def effective_allocator(self) -> str:
            return "mixed (LMCache disabled lazy: pinning unsupported here)"

        def stop(self) -> list[int]:
            return []

    _patch(monkeypatch, Process, Server)
    for role in ("store", "fetch"):  # what the two clients would have written
        (tmp_path / f"{role}.json").write_text(json.dumps({"role": role}))
    outcome = tp.run_pair(tmp_path, "salt", allocator="lazy")
    record = outcome.launch
    assert record is not None
    assert [p.name for p in record.processes] == [
        "lmcache server (mixed)", "transfer replica A", "transfer replica B"]
    assert record.processes[2].argv[3] == "fetch"
    assert record.server == ServerConfig(allocator="lazy", l1_size_gb=0.25, chunk_size=tp.CHUNK)
    assert [(r.name, r.url, r.devices, r.log) for r in record.replicas] == [
        ("A", None, None, tmp_path / "replica-store.log"),
        ("B", None, None, tmp_path / "replica-fetch.log")]
    assert record.labels == {"provider": "transfer (cpu)",
                             "allocator": "mixed (LMCache disabled lazy: pinning unsupported "
                                          "here)", "delay": "0"}
