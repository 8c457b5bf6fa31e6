"""The launcher's own logic on CPU: free ports, readiness, log tails, crash of a replica,
teardown of the whole process group, proven against a stub server (a test double) and the
real LMCache server (which runs without a GPU)."""

from __future__ import annotations

import json
import signal
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from pytest_sharedkv.processes.managed import (
    ManagedProcess,
    ProcessFailed,
    free_port,
    group_members,
    http_ok,
    tcp_open,
)
from pytest_sharedkv.processes.supervise import is_watchdog
from pytest_sharedkv.stack.engine_settings import PERF_ENGINE, EngineSettings
from pytest_sharedkv.stack.launch.spec import LaunchSpec


def _stub(tmp_path: Path, *extra: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = [sys.executable, "-m", "pytest_sharedkv.stack.stub.stub_openai", "--port", str(port),
            "--name", "A", *extra]
    return ManagedProcess("stub replica A", argv, tmp_path / "a.log"), f"http://127.0.0.1:{port}"


def test_ready_then_stopped_with_no_orphans(tmp_path: Path) -> None:
    proc, url = _stub(tmp_path)
    proc.start()
    try:
        # a limit that only catches a hang; benchmarks/processes.py times the start
        proc.wait_ready(lambda: http_ok(url + "/health"), 120, "serving /health")
        # the command and the supervisor's watchdog, nothing else
        members = group_members(proc.pid)
        assert [p for p in members if not is_watchdog(p)] == [proc.pid] and len(members) == 2
    finally:
        leftovers = proc.stop()
    assert leftovers == []
    assert not http_ok(url + "/health")
    assert "TEST DOUBLE serving on 127.0.0.1" in proc.log_text()


def test_never_ready_fails_with_the_log_tail(tmp_path: Path) -> None:
    """Once the stub listens (a limit that only catches a hang), its /health answers 503:
    the wait's first look is logged, and the wait fails at its limit with the log tail."""
    proc, url = _stub(tmp_path, "--never-ready")
    proc.start()
    try:
        port = int(url.rsplit(":", 1)[1])
        proc.wait_ready(lambda: tcp_open(port), 120, "listening")
        with pytest.raises(ProcessFailed) as info:
            proc.wait_ready(lambda: http_ok(url + "/health"), 1, "serving /health")
    finally:
        assert proc.stop() == []
    text = str(info.value)
    assert "stub replica A: not serving /health within 1s" in text
    assert "--- last lines of" in text
    assert "GET /health" in text


def test_process_that_dies_at_start_is_named(tmp_path: Path) -> None:
    proc = ManagedProcess("broken", [sys.executable, "-c", "import sys; print('boom');"
                                     "sys.exit(7)"], tmp_path / "b.log")
    proc.start()
    with pytest.raises(ProcessFailed, match=r"broken: exited with status 7 before ready"):
        proc.wait_ready(lambda: False, 30, "ready")
    assert "boom" in proc.tail()
    assert proc.stop() == []


def _says_up(proc: ManagedProcess) -> bool:
    return "up" in proc.log_text()


def test_whole_group_is_killed_even_if_the_leader_ignores_sigterm(tmp_path: Path) -> None:
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print('up', flush=True)\n"
            "time.sleep(600)\n")
    def members(proc: ManagedProcess) -> list[int]:
        return [p for p in group_members(proc.pid) if not is_watchdog(p)]

    # The group must hold the leader and its child before stop() is asked to end it. In
    # one CI run (2026-12-03) the child was gone before it was counted, with nothing in its
    # log and stop() not yet called: a group that lost its child before the test began is
    # started again, once, and a second such start fails naming it.
    seen = []
    for attempt in range(2):
        proc = ManagedProcess("stubborn", [sys.executable, "-c", code],
                              tmp_path / f"s{attempt}.log")
        proc.start()
        proc.wait_ready(partial(_says_up, proc), 30, "up")
        deadline = time.monotonic() + 30  # the child may take a while to appear when loaded
        while len(members(proc)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        seen.append(members(proc))
        if len(seen[-1]) == 2:
            break
        assert proc.stop(grace=1.0) == []
    assert len(seen[-1]) == 2, f"the leader's child was gone before stop() in both starts: {seen}"
    assert proc.stop(grace=1.0) == []
    # the leader ignored SIGTERM: only the SIGKILL after the grace ended it (how long stop
    # takes is benchmarks/processes.py's to say)
    assert proc.proc is not None and proc.proc.returncode == -signal.SIGKILL


def test_crash_mid_test_is_reported(tmp_path: Path) -> None:
    import json
    import urllib.request

    proc, url = _stub(tmp_path, "--crash-after", "1")
    proc.start()
    proc.wait_ready(lambda: http_ok(url + "/health"), 30, "serving /health")
    body = json.dumps({"prompt": "a b c", "max_tokens": 2}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["X-Sharedkv-Test-Double"] == "1"
    deadline = time.monotonic() + 10
    while proc.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proc.alive()
    assert "crashing on purpose after 1 completions" in proc.tail()
    assert proc.stop() == []


@pytest.mark.parametrize("allocator", ["lazy", "mixed"])
def test_real_lmcache_server_starts_and_stops_on_cpu(tmp_path: Path, allocator: str) -> None:
    pytest.importorskip("lmcache")
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    server = LMCacheServer(ServerConfig(allocator=allocator, l1_size_gb=0.25, chunk_size=160),
                           tmp_path)
    server.start()
    try:
        assert server.health().get("status") == "ok"
        assert server.startup_s is not None
        effective = server.effective_allocator()
        if allocator == "lazy":  # no CUDA here: LMCache turns lazy off and says so
            assert effective.startswith("mixed (LMCache disabled lazy")
        else:
            assert effective == "mixed"
    finally:
        leftovers = server.stop()
    assert leftovers == []
    assert not http_ok(server.http_url + "/")


def test_restart_gives_a_fresh_process_that_still_reaches_the_pool(tmp_path: Path) -> None:
    from pytest_sharedkv.stack.launch.providers import external_pair, stub_pair
    from pytest_sharedkv.stack.launch.spec import LaunchSpec
    from pytest_sharedkv.stack.pair import ReplicaError

    pair = stub_pair(LaunchSpec(log_dir=tmp_path))
    try:
        prompt = "restart " * 600
        a = pair.send("A", prompt, 8, "salt-restart")
        old = pair["B"].process
        assert old is not None
        old_pid = old.pid
        pair.restart("B")
        assert pair["B"].process is not None and pair["B"].process.pid != old_pid
        assert group_members(old_pid) == []  # nothing of the old B is left
        assert len(pair["B"].start_seconds) == 2
        b = pair.send("B", prompt, 8, "salt-restart")
        assert b.text == a.text
        assert (b.external_hit_tokens or 0) > 0 and b.local_hit_tokens == 0
    finally:
        assert pair.close() == []
    with pytest.raises(ReplicaError, match="external: the suite cannot restart it"):
        external_pair(("http://127.0.0.1:9", "http://127.0.0.1:10")).restart("A")


REGISTER_FAILURE_LOG = """\
[2026-11-30 14:49:25,386] LMCache ERROR: Error handling operation register_kv_cache (mq.py:798)
Traceback (most recent call last):
  File "/tmp/site/lmcache/v1/platform/base/ipc_wrapper.py", line 105, in _get_device_index_from_uuid
    raise RuntimeError(
RuntimeError: Device UUID 149562a8 not found in the discovered devices. Please make sure \
the process can see all the accelerator devices
[2026-11-30 14:49:26,700] LMCache INFO: Engine KV Format: ...
"""


def test_a_failed_engine_registration_stops_the_replicas_wait(tmp_path: Path) -> None:
    """On an H200 pair one replica per GPU, the server (which saw one GPU) logged a failed
    register_kv_cache and replica B waited for it until the run's limit; now the wait ends
    at once with LMCache's own reason."""
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    server = LMCacheServer(ServerConfig(), tmp_path)
    server.process.alive = lambda: True  # type: ignore[method-assign]
    server.process.log_path.write_text("[..] LMCache INFO: starting\n" * 1000)
    assert server.fatal_error() is None
    with server.process.log_path.open("a") as log:
        log.write(REGISTER_FAILURE_LOG)
    reason = server.fatal_error()
    assert reason is not None and "Device UUID 149562a8 not found" in reason

    proc = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                          tmp_path / "sleeper.log")
    proc.start()
    looks: list[float] = []

    def ready() -> bool:
        looks.append(time.monotonic())
        return False

    try:
        with pytest.raises(ProcessFailed, match=r"cannot become serving.*Device UUID"):
            proc.wait_ready(ready, 60, "serving /health", abort=server.fatal_error)
        # the peer's reason ended the wait before its first look at readiness, not at its
        # limit (how long it takes is benchmarks/processes.py's to say)
        assert looks == []
    finally:
        proc.stop()


@pytest.mark.parametrize(("hosts", "servers"), [(False, ["GPU-a,GPU-b"]),
                                                 (True, ["GPU-a", "GPU-b"])])
def test_the_server_of_a_two_gpu_pair_sees_both_gpus(tmp_path: Path, hosts: bool,
                                                     servers: list[str]) -> None:
    """One server both replicas share sees both GPUs; in the hosts topology each replica's
    own server sees its replica's GPU, with the L2 adapter. A launch that fails stops every
    server it made."""
    from pytest_sharedkv.stack.launch import providers
    from pytest_sharedkv.stack.topology import HostsSpec

    seen: list[tuple[str, tuple[str, ...]]] = []
    stopped: list[str] = []

    class Server:
        port = 1

        def __init__(self, config: object, log_dir: Path, env: dict[str, str],
                     role: str = "") -> None:
            seen.append((env["CUDA_VISIBLE_DEVICES"], config.l2_adapters))  # type: ignore[attr-defined]

        def launch(self) -> None:
            raise RuntimeError("stop here")

        def stop(self) -> list[int]:
            stopped.append("yes")
            return []

    adapter = '{"base_path": "/kv", "type": "fs"}'
    spec = LaunchSpec(tmp_path, model=tmp_path, devices=("GPU-a", "GPU-b"),
                                hosts=HostsSpec(adapter, "fs -> /kv") if hosts else None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(providers, "LMCacheServer", Server)
        with pytest.raises(RuntimeError, match="stop here"):
            providers.launch_vllm_pair(spec)
    assert [devices for devices, _ in seen] == servers
    assert [adapters for _, adapters in seen] == [(adapter,) if hosts else ()] * len(servers)
    assert stopped == ["yes"] * len(servers)  # a server whose start failed is stopped


class _FakeServer:
    """LMCacheServer's surface as launch_vllm_pair uses it; records its stop."""

    port = 5555
    startup_s = 1.5
    stopped: list[str] = []

    def __init__(self, config: object, log_dir: Path, env: dict[str, str],
                 role: str = "") -> None:
        from pytest_sharedkv.processes.managed import ManagedProcess

        self.config = config
        name = f"lmcache server {role}" if role else "lmcache server"
        self.process = ManagedProcess(f"{name} (mixed)", ["lmcache", "serve"],
                                      log_dir / "s.log", env={**env, "SERVER_X": "1"})
        self.metrics_url = "http://127.0.0.1:1/metrics"

    def start(self) -> None:
        pass

    def launch(self) -> None:
        pass

    def wait_ready(self) -> None:
        pass

    def effective_allocator(self) -> str:
        return "mixed"

    def stop(self) -> list[int]:
        self.stopped.append("server")
        return []

    def fatal_error(self) -> str | None:
        return None


def test_a_launch_that_fails_after_the_server_started_stops_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything that raises between the server's start and the replicas' (here: building a
    replica's command line) stops the server then and there, not at the watchdog's."""
    from pytest_sharedkv.stack.launch import providers

    stopped: list[str] = []
    monkeypatch.setattr(_FakeServer, "stopped", stopped)
    monkeypatch.setattr(providers, "LMCacheServer", _FakeServer)

    def broken(*args: object) -> list[str]:
        raise OSError("no such model file")

    monkeypatch.setattr(providers, "vllm_argv", broken)
    with pytest.raises(OSError, match="no such model file"):
        providers.launch_vllm_pair(LaunchSpec(tmp_path, model=tmp_path))
    assert stopped == ["server"]
    # the OFF arm starts no server: nothing to stop, the error as raised
    with pytest.raises(OSError, match="no such model file"):
        providers.launch_vllm_pair(LaunchSpec(tmp_path, model=tmp_path, arm="OFF"))
    assert stopped == ["server"]


@pytest.mark.parametrize(("arm", "wanted", "unwanted"), [
    ("ON", ["--kv-transfer-config"], ["--kv-offloading-backend"]),
    ("OFF", [], ["--kv-transfer-config", "--kv-offloading-backend"]),
    ("NATIVE", ["--kv-offloading-size", "16", "--kv-offloading-backend", "native"],
     ["--kv-transfer-config"]),
])
def test_each_arm_launches_vllm_with_its_own_cache_path(
        tmp_path: Path, arm: str, wanted: list[str], unwanted: list[str]) -> None:
    """ON: LMCache's MP connector; OFF: GPU prefix caching alone; NATIVE: vLLM's own CPU
    offloading at the pool's size (per replica, not shared)."""
    from pytest_sharedkv.stack.launch.providers import vllm_argv
    from pytest_sharedkv.stack.launch.spec import LaunchSpec
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    spec = LaunchSpec(log_dir=tmp_path, arm=arm, l1_size_gb=16.0)
    server = LMCacheServer(ServerConfig(), tmp_path) if arm == "ON" else None
    argv = vllm_argv(tmp_path, 8000, server, spec)
    joined = " ".join(argv)
    assert " ".join(wanted) in joined
    assert not [flag for flag in unwanted if flag in argv]


START_FAILURE_LOG = Path(__file__).parent / "data" / "vllm-A-lmcache053-start.log"


def test_start_failure_names_the_root_cause_far_above_the_tail(tmp_path: Path) -> None:
    """The real LMCache 0.5.3 replica log of issue 19's GPU run: its cause (LMCache's
    ValueError) is 55 lines above the end, under the APIServer's wrapper traceback; the
    40-line tail alone never showed it."""
    code = ("import sys; sys.stdout.write(open(sys.argv[1]).read()); sys.stdout.flush();"
            "sys.exit(1)")
    proc = ManagedProcess("vllm replica A", [sys.executable, "-c", code,
                                             str(START_FAILURE_LOG)], tmp_path / "a.log")
    proc.start()
    with pytest.raises(ProcessFailed) as info:
        proc.wait_ready(lambda: False, 30, "serving /health")
    assert proc.stop() == []
    text = str(info.value)
    assert text.startswith("vllm replica A: exited with status 1 before serving /health")
    cause = ("ValueError: Mamba-hybrid models with LMCache require block_size <= "
             "max_num_batched_tokens < 2 * block_size")
    assert cause in text
    assert "lmcache/integration/vllm/lmcache_mp_connector.py:172 in " in text
    wrapper = "RuntimeError: Engine core initialization failed. See root cause above."
    assert text.index(cause) < text.index(wrapper)
    assert text.count(cause) == 1  # logged twice (ERROR-prefixed and raw), quoted once
    assert "--- last lines of" in text
    assert len(text) < 6000 and len(text.splitlines()) < 30


def test_logged_errors_reads_chains_and_bare_lines() -> None:
    from pytest_sharedkv.processes.log_errors import failure_context, logged_errors

    log = "\n".join([
        "starting",
        "Traceback (most recent call last):",
        '  File "/a/b.py", line 3, in f',
        "    raise KeyError('x')",
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/a/c.py", line 9, in g',
        "    raise lib.SetupFailed('no GPU')",
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "lib.SetupFailed: no GPU",
        "RuntimeError: Engine core initialization failed.",
        "ok: not an error",
    ])
    found = logged_errors(log)
    assert [(e.text, e.where) for e in found] == [
        ("KeyError: 'x'", "/a/b.py:3 in f"),
        ("lib.SetupFailed: no GPU", "/a/c.py:9 in g"),
        ("RuntimeError: Engine core initialization failed.", None),
    ]
    quiet = failure_context("line 1\nline 2\n", "x.log", plain_tail=40)
    assert quiet == "--- last lines of x.log ---\nline 1\nline 2"
    many = "\n".join(f"E{i}Error: {i}" for i in range(10))
    shown = failure_context(many, "m.log", plain_tail=40)
    assert "6 earlier not shown" in shown and "E9Error: 9" in shown
    assert "E5Error: 5" not in shown.split("--- last lines")[0]


def test_perf_arms_run_with_cuda_graphs_and_the_correctness_tiers_eager(tmp_path: Path) -> None:
    """The engine flags come from one recorded structure: EngineSettings() keeps eager mode
    (the service tier), PERF_ENGINE runs with CUDA graphs as production does."""
    from pytest_sharedkv.stack.engine_settings import PERF_ENGINE
    from pytest_sharedkv.stack.launch.providers import vllm_argv
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    eager = vllm_argv(tmp_path, 8000, None, LaunchSpec(log_dir=tmp_path))
    graphs = vllm_argv(tmp_path, 8000, None, LaunchSpec(log_dir=tmp_path, engine=PERF_ENGINE))
    assert "--enforce-eager" in eager and "--enforce-eager" not in graphs
    for argv in (eager, graphs):
        assert argv[argv.index("--max-num-seqs") + 1] == "16"
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.35"
        assert json.loads(argv[argv.index("--additional-config") + 1]) == {
            "gdn_prefill_backend": "triton"}
    assert PERF_ENGINE.record()["enforce_eager"] is False
    assert PERF_ENGINE.record()["env"] == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


def test_a_kv_budget_the_load_settings_and_user_flags_reach_the_argv(tmp_path: Path) -> None:
    from dataclasses import replace

    from pytest_sharedkv.stack.engine_settings import PERF_ENGINE, EngineSettings
    from pytest_sharedkv.stack.launch.providers import together, vllm_argv
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    engine = replace(PERF_ENGINE, kv_cache_bytes=38 << 30, load_format="dummy",
                     quantization="fp8", extra_args=("--max-num-seqs", "32", "--foo", "a b"))
    spec = LaunchSpec(log_dir=tmp_path, engine=engine, devices=("0",))
    argv = vllm_argv(tmp_path, 8000, None, spec)
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(38 << 30)
    # beside a fixed cache the utilization sizes nothing: it is vLLM's start check only
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.35"
    assert " ".join(argv).count("--load-format dummy --quantization fp8") == 1
    assert argv[-4:] == ["--max-num-seqs", "32", "--foo", "a b"]  # last: the user's win
    assert together(spec)  # one GPU, a fixed cache each: both start at once
    assert not together(LaunchSpec(log_dir=tmp_path, devices=("0",)))  # one after the other
    assert together(LaunchSpec(log_dir=tmp_path, devices=("0", "1")))
    # the user's own fixed cache (--sharedkv-vllm-args, as the H200 waves ran): the H200's
    # service pairs started A, then B 57 s later, each relaunch of a triage cell as well
    for flags in (("--kv-cache-memory-bytes", "4294967296"), ("--kv-cache-memory-bytes=4G",)):
        assert together(LaunchSpec(log_dir=tmp_path, devices=("0",),
                                   engine=EngineSettings(extra_args=flags)))
    assert not together(LaunchSpec(log_dir=tmp_path, devices=("0",), engine=EngineSettings(
        extra_args=("--gpu-memory-utilization", "0.05"))))


@pytest.mark.parametrize(("devices", "placed"), [
    (("3",), {"A": ("3",), "B": ("3",)}),  # both replicas on the one device
    (("3", "5"), {"A": ("3",), "B": ("5",)}),  # one replica per device
])
def test_every_launched_process_is_recorded_with_the_env_the_suite_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices: tuple[str, ...],
        placed: dict[str, tuple[str, ...]]) -> None:
    """The LMCache server and both replicas: argv and the variables the suite set (the
    caller's own environment is not recorded); the start is together with a KV budget;
    each replica's devices (its placement)."""
    from dataclasses import replace

    from pytest_sharedkv.stack.launch import providers
    from pytest_sharedkv.stack.lmcache_server import ServerConfig

    started: list[bool] = []
    stopped: list[str] = []
    monkeypatch.setattr(_FakeServer, "stopped", stopped)
    monkeypatch.setattr(providers, "LMCacheServer", _FakeServer)
    monkeypatch.setattr(providers, "start_all",
                        lambda pair, together=False: started.append(together))
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    monkeypatch.setenv("UNRELATED_CALLER_VAR", "x")
    engine = replace(PERF_ENGINE, kv_cache_bytes=1 << 30)
    pair = providers.launch_vllm_pair(LaunchSpec(
        tmp_path, model=tmp_path, devices=devices, engine=engine))
    names = [x["name"] for x in pair.launches]
    assert names == ["lmcache server (mixed)", "vllm replica A", "vllm replica B"]
    server, replica = pair.launches[0], pair.launches[1]
    assert server["argv"] == ["lmcache", "serve"] and server["env"]["SERVER_X"] == "1"
    assert "--kv-cache-memory-bytes" in replica["argv"]
    assert replica["env"]["CUDA_VISIBLE_DEVICES"] == "3"
    assert replica["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert all("UNRELATED_CALLER_VAR" not in x["env"] for x in pair.launches)
    assert pair.engine_settings["kv_cache_bytes"] == 1 << 30
    assert started == [True]
    assert pair.devices == placed
    # the server's measured start; replicas that never started (start_all is faked) none
    assert pair.starts == {"lmcache server (mixed)": {"ready": 1.5}}
    assert stopped == []  # the pair owns the server now: stopped by pair.close()
    record = pair.record
    assert record.server == ServerConfig(allocator="mixed", l1_size_gb=8.0, ready_timeout=900.0)
    assert record.engine == engine and record.model == tmp_path and record.arm == "ON"
    for launch in record.replicas:
        assert launch.url == f"http://127.0.0.1:{launch.port}"
        assert launch.log == tmp_path / f"vllm-{launch.name}-{launch.port}.log"
    assert pair.labels == {"provider": "vllm", "allocator": "mixed", "delay": "0"}
    assert pair.gate_control == tmp_path / "gate-control.json" and pair.has_server
    assert pair.kv_audit_dir is None and pair.inject_log is None and pair.sync_log is None


def test_every_provider_constructs_its_pair_with_one_launch_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub's record says what it started (processes, ports, logs) and that it placed
    no engine on a GPU; external endpoints' says what is known (the URLs) and leaves the
    rest unknown (None), never a guess; a record cannot change once the pair has it."""
    import dataclasses

    from pytest_sharedkv.stack.launch import providers

    monkeypatch.setattr(providers, "start_all", lambda pair, together=False: None)
    stub = providers.stub_pair(LaunchSpec(tmp_path, kv_audit=True, arm="NATIVE"))
    record = stub.record
    assert (record.provider, record.arm) == ("stub (test double)", "NATIVE")
    assert [p.name for p in record.processes] == ["stub replica A", "stub replica B"]
    assert [r.name for r in record.replicas] == ["A", "B"]
    for replica in record.replicas:
        assert replica.devices is None and replica.port is not None
        assert replica.log == tmp_path / f"stub-{replica.name}-{replica.port}.log"
    assert stub.devices == {}  # no engine on a GPU: the placement is unknown, not "inherited"
    assert stub.labels == {"provider": "stub (test double)", "allocator": "native (own pool)",
                           "delay": "0"}
    assert stub.kv_audit_dir == tmp_path / "kv-audit" and not stub.has_server
    assert stub.engine_settings == EngineSettings().record()
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.allocator = "mixed"  # type: ignore[misc]

    external = providers.external_pair(("http://h:1/", "http://h:2"))
    known = external.record
    assert [(r.name, r.url) for r in known.replicas] == [("A", "http://h:1"), ("B", "http://h:2")]
    assert (known.allocator, known.engine, known.server, known.model, known.arm) == (
        None, None, None, None, None)
    assert all((r.devices, r.port, r.log) == (None, None, None) for r in known.replicas)
    assert external.labels == {"provider": "external", "allocator": "unknown", "delay": "0"}
    assert (external.launches, external.engine_settings, external.devices) == ([], {}, {})
    assert external.relaunch is None and not external.has_server
    assert external.gate_control is None and external.kv_audit_dir is None


def test_each_replica_compiles_into_its_own_cache(tmp_path: Path) -> None:
    """Two engines compiling at once never share VLLM_CACHE_ROOT; the server gets none."""
    from pytest_sharedkv.stack.launch.providers import process_env
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    spec = LaunchSpec(log_dir=tmp_path, compile_cache=tmp_path / "cache")
    a = process_env(spec, role="replica A", base={})
    b = process_env(spec, role="replica B", base={})
    assert (a["VLLM_CACHE_ROOT"], b["VLLM_CACHE_ROOT"]) == (
        str(tmp_path / "cache" / "A"), str(tmp_path / "cache" / "B"))
    assert "VLLM_CACHE_ROOT" not in process_env(spec, role="lmcache server", base={})
    assert "VLLM_CACHE_ROOT" not in process_env(LaunchSpec(log_dir=tmp_path),
                                                role="replica A", base={})
