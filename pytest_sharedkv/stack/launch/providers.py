"""Replica providers: how a pair of replicas over one LMCache pool comes to exist.

* ``vllm`` (launched): an LMCache server and two ``vllm serve`` processes with the
  LMCache MP connector, prefix caching on; one GPU each when two are leased, else both on
  one GPU, started one after the other with a memory cap each. The perf tier's OFF arm
  (``LaunchSpec.arm``) starts the two engines alone: GPU prefix caching, no connector, no
  pool.
* ``external``: two URLs (``--sharedkv-endpoints``); nothing is started or stopped.
* ``stub``: two stub OpenAI servers: a TEST DOUBLE for the launcher's own tests, never a
  result about a KV stack.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.config.engine import Engine
from pytest_sharedkv.engine_hooks import corrupt_hook, kv_audit_hook, sync_hook
from pytest_sharedkv.engine_hooks.delay_hook import (
    CYCLES_ENV,
    LOG_ENV,
    ROLE_ENV,
    SERVER_ROLE,
)
from pytest_sharedkv.engine_hooks.switches import arms_a_hook
from pytest_sharedkv.processes.managed import ManagedProcess, free_port
from pytest_sharedkv.stack.engine_settings import KV_CACHE_FLAG
from pytest_sharedkv.stack.faults import stub_hook_flags
from pytest_sharedkv.stack.launch.spec import (
    INJECT_DIR,
    LaunchSpec,
    audit_dir,
    gate_paths,
    inject_log,
    sync_log,
)
from pytest_sharedkv.stack.launch_record import (
    Launched,
    LaunchPaths,
    LaunchRecord,
    ReplicaLaunch,
    launched,
)
from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig
from pytest_sharedkv.stack.pair import Replica, ReplicaPair, start_all
from pytest_sharedkv.stack.topology import HOSTS, SHARED, HostsSpec, ServerView, Topology

if TYPE_CHECKING:
    pass

SERVED_NAME = "sharedkv-model"


def process_env(spec: LaunchSpec, devices: tuple[str, ...] = (),
                base: Mapping[str, str] | None = None, role: str = "process") -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    hooked = False
    if spec.inject_delay_cycles:
        # With synchronous launches the delay is over before the copy starts: a delayed
        # cell would pass whatever the copy path does.
        env.pop("CUDA_LAUNCH_BLOCKING", None)
        env[CYCLES_ENV] = str(spec.inject_delay_cycles)
        env[LOG_ENV] = str(inject_log(spec.log_dir))
        env[ROLE_ENV] = role
        hooked = True
    if spec.gate and role == SERVER_ROLE:
        control, log = gate_paths(spec.log_dir)
        env[corrupt_hook.CONTROL_ENV] = str(control)
        env[corrupt_hook.LOG_ENV] = str(log)
        hooked = True
    if role == SERVER_ROLE:
        env.update(spec.server_env)
        hooked = hooked or arms_a_hook(spec.server_env)  # a control's hook, by its switch
        if spec.sync_transfers:
            env[sync_hook.LOG_ENV] = str(sync_log(spec.log_dir))
            env[ROLE_ENV] = role
            hooked = True
    elif role.startswith("replica "):
        env.update(spec.replica_env)
        if spec.compile_cache is not None:
            env["VLLM_CACHE_ROOT"] = str(spec.compile_cache / role.removeprefix("replica "))
    if spec.kv_audit and role.startswith("replica "):
        env[kv_audit_hook.DIR_ENV] = str(audit_dir(spec.log_dir))
        env[kv_audit_hook.ROLE_ENV] = role.removeprefix("replica ")
        hooked = True
    if hooked:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(INJECT_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def vllm_argv(model: Path, port: int, server: LMCacheServer | None, spec: LaunchSpec
              ) -> list[str]:
    """``vllm serve`` for vLLM 0.26 with LMCache's MP connector (see shared/gpu-host), or
    with no connector at all when there is no SERVER (GPU prefix caching alone)."""
    argv = [
        sys.executable, "-c", "from vllm.entrypoints.cli.main import main; main()", "serve",
        str(model),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--max-model-len", str(spec.max_model_len), *spec.engine.flags(),
    ]
    ssm = _ssm_dtype(model)
    if ssm is not None:  # the geometry model's float32 state, as the 27B keeps it
        argv += ["--mamba-ssm-cache-dtype", ssm]
    if spec.arm == "NATIVE":  # vLLM's OffloadingConnector, the pool's size per replica
        argv += ["--kv-offloading-size", f"{spec.l1_size_gb:g}",
                 "--kv-offloading-backend", "native"]
    if server is not None:
        transfer = {
            "kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1",
                                          "lmcache.mp.port": server.port},
        }
        argv += ["--kv-transfer-config", json.dumps(transfer)]
    if spec.engine.additional_config:
        argv += ["--additional-config", json.dumps(dict(spec.engine.additional_config))]
    return [*argv, *spec.engine.extra_args]


def _ssm_dtype(model: Path) -> str | None:
    """The Gated DeltaNet state dtype a config.json names (Qwen3.5: float32), which the
    engine must keep too: the LMCache chunk size is derived from it."""
    from pytest_sharedkv.models.config_file import ModelConfigError, read_config

    try:
        value = read_config(model).get("mamba_ssm_dtype")
    except ModelConfigError:
        return None
    text = str(value).removeprefix("torch.") if value is not None else None
    return text if text in ("float32", "float16", "bfloat16") else None


def launch_vllm_pair(spec: LaunchSpec) -> ReplicaPair:
    if spec.model is None:
        raise ValueError("the vllm provider needs a model (--sharedkv-model, else the tier's "
                         "generated one: the copy model, or the geometry model for perf)")
    servers: list[LMCacheServer] = []
    with ExitStack() as started:  # anything that raises before the pair exists stops it
        if spec.arm == "ON":
            servers = lmcache_servers(spec)
            for server in servers:
                started.callback(server.stop)
            for server in servers:  # the hosts topology's two start at once
                server.launch()
            for server in servers:
                server.wait_ready()  # L2NotAttached names the adapter and the log line
        pair = build_vllm_pair(spec, servers)
        started.pop_all()
    # one GPU each, or a fixed cache each: no profiling of each other's memory
    start_all(pair, together=together(spec))  # stops the whole pair if a replica fails
    pair.starts = start_record(servers, pair.replicas)
    pair.gpu_kv_tokens = gpu_kv_capacity(pair.replicas)
    return pair


def replica_devices(spec: LaunchSpec, index: int) -> tuple[str, ...]:
    """Replica INDEX's devices: its own GPU when two are leased, else the one."""
    return spec.devices[index:index + 1] if len(spec.devices) > 1 else spec.devices[:1]


def lmcache_servers(spec: LaunchSpec) -> list[LMCacheServer]:
    """The LMCache servers of an ON launch (not started): one both replicas share, or in
    the hosts topology one per replica, each on its replica's device with its L1 and the
    L2 adapter the spec gives it."""
    from pytest_sharedkv.stack.lmcache_server import eviction_counting_problem

    # a server asked to count without the exporter would exit at start: count nothing
    uncounted = eviction_counting_problem() if spec.count_evictions else ""

    def config(adapters: tuple[str, ...] = ()) -> ServerConfig:
        return ServerConfig(allocator=spec.allocator, l1_size_gb=spec.l1_size_gb,
                            chunk_size=spec.chunk_size, ready_timeout=spec.ready_timeout,
                            l2_adapters=adapters,
                            count_evictions=spec.count_evictions and not uncounted,
                            uncounted=uncounted)

    if spec.hosts is None:
        # The server maps every engine's KV cache through CUDA IPC: it must see every
        # leased device (on one GPU only, register_kv_cache fails for the other's).
        return [LMCacheServer(config(), spec.log_dir,
                              env=process_env(spec, spec.devices, role=SERVER_ROLE))]
    return [LMCacheServer(config((adapter,)), spec.log_dir,
                          env=process_env(spec, replica_devices(spec, index), role=SERVER_ROLE),
                          role=str(index + 1))
            for index, adapter in enumerate(spec.hosts.adapters)]


def topology_of(spec: LaunchSpec, servers: list[ServerView]) -> Topology:
    """What the tiers read of a pair's servers: in the hosts topology, the L2 too (from
    its adapter JSON: nothing is started or stopped through it)."""
    if spec.hosts is None:
        return Topology(SHARED, tuple(servers), chunk=spec.chunk_size)
    from pytest_sharedkv.stack.l2.backends import parse_adapter

    l2, _ = parse_adapter(json.loads(spec.hosts.adapter))
    return Topology(HOSTS, tuple(servers), l2=l2, spec=spec.hosts, chunk=spec.chunk_size)


def build_vllm_pair(spec: LaunchSpec, servers: Sequence[LMCacheServer] = ()) -> ReplicaPair:
    """The pair of vllm replicas SPEC describes, built but not started: each replica's argv
    and environment and the launch record, over SERVERS if any (one both use, or one
    each; none: no server in the record)."""
    assert spec.model is not None
    processes: list[Launched] = [launched(s.process.name, s.process.argv, s.process.env)
                                 for s in servers]
    replicas: dict[str, Replica] = {}
    placed: list[ReplicaLaunch] = []
    for index, name in enumerate(("A", "B")):
        devices = replica_devices(spec, index)
        server = servers[min(index, len(servers) - 1)] if servers else None
        port = free_port()
        env = process_env(spec, devices, role=f"replica {name}")
        for key, value in spec.engine.env:
            env.setdefault(key, value)
        argv = vllm_argv(spec.model, port, server, spec)
        if spec.stack is not None:  # the stack's flags before the user's, its variables
            argv, env = spec.stack.replica_argv(argv, spec.engine.extra_args), \
                {**env, **spec.stack.replica_env(name)}
        log = spec.log_dir / f"vllm-{name}-{port}.log"
        process = ManagedProcess(f"vllm replica {name}", argv, log, env=env)
        processes.append(launched(process.name, argv, env))
        url = f"http://127.0.0.1:{port}"
        replicas[name] = Replica(name, url, process, ready_timeout=spec.ready_timeout,
                                 model=SERVED_NAME, reports_external=True,
                                 abort=server.fatal_error if server is not None else None)
        placed.append(ReplicaLaunch(name, url, devices=devices, port=port, log=log))
    server = servers[0] if servers else None
    allocator = (server.effective_allocator() if server is not None else
                 f"native offloading ({spec.l1_size_gb:g} GB each)" if spec.arm == "NATIVE"
                 else "none (no pool)")
    where = (f"lmcache server x2 (hosts: {spec.hosts.l2})"
             if spec.hosts is not None and len(servers) > 1 else "lmcache server")
    description = (f"vllm x2 + {where} ({allocator})" if server is not None else
                   f"vllm x2 ({allocator})" if spec.arm == "NATIVE" else "vllm x2 (no pool)")
    gate = spec.gate and server is not None
    paths = LaunchPaths(
        log_dir=spec.log_dir,
        gate_control=gate_paths(spec.log_dir)[0] if gate else None,
        gate_log=gate_paths(spec.log_dir)[1] if gate else None,
        kv_audit_dir=audit_dir(spec.log_dir) if spec.kv_audit else None,
        sync_log=sync_log(spec.log_dir) if spec.sync_transfers and server is not None else None,
        inject_log=inject_log(spec.log_dir) if spec.inject_delay_cycles else None)
    hosts = spec.hosts is not None and server is not None
    record = LaunchRecord(provider="vllm", description=description, replicas=tuple(placed),
                          allocator=allocator, delay_cycles=spec.inject_delay_cycles,
                          arm=spec.arm, model=spec.model, processes=tuple(processes),
                          engine=spec.engine,
                          server=server.config if server is not None else None, paths=paths,
                          topology=HOSTS if hosts else SHARED,
                          l2=spec.hosts.l2 if spec.hosts is not None and hosts else None,
                          host_servers=tuple(s.config for s in servers) if hosts else ())
    if spec.stack is not None:
        record = spec.stack.named_in(record)
    views = [ServerView(f"server {i + 1}" if hosts else "server", s.process.log_text,
                        (s.metrics_url,),
                        s.config.count_evictions or bool(s.config.uncounted))
             for i, s in enumerate(servers)]

    def stop_servers() -> list[int]:
        return [pid for s in servers for pid in s.stop()]

    return ReplicaPair(replicas["A"], replicas["B"], record,
                       stop_server=stop_servers if servers else None,
                       relaunch=lambda **changes: launch_vllm_pair(replace(spec, **changes)),
                       topology=topology_of(spec if hosts else replace(spec, hosts=None),
                                            views) if servers else None)


def start_record(servers: list[LMCacheServer],
                 replicas: Mapping[str, Replica]) -> dict[str, dict[str, float]]:
    """Each launched process's start: the suite's ready time, and for an engine the
    phases vLLM's log names."""
    from pytest_sharedkv.stack.launch.engine_start import READY, vllm_phases

    starts: dict[str, dict[str, float]] = {}
    for server in servers:
        if server.startup_s is not None:
            starts[server.process.name] = {READY: server.startup_s}
    for replica in replicas.values():
        if replica.process is None:
            continue
        phases = vllm_phases(replica.process.log_text())
        if replica.start_seconds:
            phases = {READY: replica.start_seconds[-1], **phases}
        if phases:
            starts[replica.process.name] = phases
    return starts


def gpu_kv_capacity(replicas: Mapping[str, Replica]) -> dict[str, int | None]:
    """Each replica's GPU KV cache in tokens, as its engine's start log says it (vLLM's
    "GPU KV cache size" line; the stub double logs its own); None where no line says it."""
    from pytest_sharedkv.stack.launch.engine_start import gpu_kv_tokens

    return {name: gpu_kv_tokens(replica.process.log_text())
            if replica.process is not None else None for name, replica in replicas.items()}


def together(spec: LaunchSpec) -> bool:
    """Whether the two replicas start at once: each on its own GPU, or both on one GPU with
    an explicit KV cache each (``--kv-cache-memory-bytes``: vLLM then does not size its
    cache from free memory the other engine is still taking), the suite's or the user's
    own (``--sharedkv-vllm-args``, which come last and win)."""
    return (len(spec.devices) > 1 or spec.engine.kv_cache_bytes is not None
            or any(arg == KV_CACHE_FLAG or arg.startswith(KV_CACHE_FLAG + "=")
                   for arg in spec.engine.extra_args))


def stub_pair(spec: LaunchSpec) -> ReplicaPair:
    """Two stub replicas (a test double) as SPEC's arm would share a pool (in the hosts
    topology: each its own server's L1, the two sharing SPEC's L2); the faults a self-test
    planted (``spec.stub_faults``) become the stubs' own flags."""
    faults = spec.stub_faults
    pool = spec.log_dir / "stub-pool"
    delayed = inject_log(spec.log_dir) if spec.inject_delay_cycles else None
    control, log = gate_paths(spec.log_dir)
    hosts = spec.hosts if spec.arm == "ON" else None
    processes: list[Launched] = []
    replicas: dict[str, Replica] = {}
    placed: list[ReplicaLaunch] = []
    for index, name in enumerate(("A", "B")):
        port = free_port()
        argv = [sys.executable, "-m", "pytest_sharedkv.stack.stub.stub_openai", "--port",
                str(port), "--name", name, "--block", str(spec.chunk_size)]
        if hosts is not None:  # its own server's L1, and the L2 both servers share
            l1 = "stub-l1-A" if faults.hosts_share_l1 else f"stub-l1-{name}"
            argv += ["--pool", str(pool.with_name(l1)), "--l2-adapter", hosts.adapters[index]]
        elif spec.arm == "ON" and spec.stack is not None \
                and spec.stack.record.get("remote_url", "") is None:  # in-process, no remote
            argv += ["--pool", str(pool.with_name(f"stub-pool-{name}"))]
        elif spec.arm == "ON":  # OFF: each stub keeps its own cache only, as an engine would
            argv += ["--pool", str(pool)]
        elif spec.arm == "NATIVE":  # a pool of its own, as vLLM's native offloading
            own = "stub-pool-A" if faults.native_share_pool else f"stub-pool-{name}"
            argv += ["--pool", str(pool.with_name(own)), "--offload-log"]
            gpu = (spec.stack.record.get("gpu_blocks") if spec.stack is not None else None)
            if gpu is not None:  # the service tier's native stack: a GPU it evicts from
                argv += ["--gpu-blocks", str(gpu)]
        if spec.stack is not None and spec.stack.record.get("prefix_caching") is False:
            argv.append("--no-prefix-caching")  # every hit from the pool, as LMCache's
        if spec.serving is Engine.SGLANG:  # usage and /metrics as SGLang gives them
            argv += ["--engine", Engine.SGLANG.value]
        if spec.stub_prefill_us:
            argv += ["--prefill-us", f"{spec.stub_prefill_us:g}"]
        argv += faults.argv(name, spec.arm, dict(spec.replica_env))
        if spec.identity is not None:  # the identity tier: its model identity, its chunk
            argv += spec.identity.argv(name)
        blocks = stub_l1_blocks(spec)
        if blocks is not None and spec.arm == "ON":  # the last --pool-blocks wins: the least
            argv += ["--pool-blocks", str(min(blocks, faults.pool_blocks or blocks))]
        argv += stub_hook_flags(dict(spec.server_env), delayed)  # it stands in for the server
        if name == "B" and not faults.no_gate and spec.gate:
            argv += ["--corrupt-control", str(control), "--corrupt-log", str(log)]
        if spec.kv_audit:  # the audit's records, written by the stub (a test double)
            argv += ["--kv-audit", str(audit_dir(spec.log_dir))]
        env = {**os.environ, **dict(spec.replica_env)} if spec.replica_env else None
        path = spec.log_dir / f"stub-{name}-{port}.log"
        process = ManagedProcess(f"stub replica {name}", argv, path, env=env)
        processes.append(launched(process.name, argv, process.env))
        url = f"http://127.0.0.1:{port}"
        replicas[name] = Replica(name, url, process, ready_timeout=60, reports_external=True,
                                 **_dialect(spec))
        placed.append(ReplicaLaunch(name, url, port=port, log=path))  # no engine, no GPU
    record = LaunchRecord(
        provider="stub (test double)",
        description="stub x2 (test double" + (f", hosts: {hosts.l2})" if hosts else ")"),
        replicas=tuple(placed),
        allocator={"ON": "n/a", "NATIVE": "native (own pool)"}.get(spec.arm, "none (no pool)"),
        arm=spec.arm, processes=tuple(processes),
        engine=spec.engine,  # what a vllm pair would have run with (the stub runs none)
        paths=LaunchPaths(log_dir=spec.log_dir, gate_control=control if spec.gate else None,
                          gate_log=log if spec.gate else None,
                          kv_audit_dir=audit_dir(spec.log_dir) if spec.kv_audit else None,
                          inject_log=delayed),
        topology=HOSTS if hosts else SHARED, l2=hosts.l2 if hosts else None)
    if spec.stack is not None:  # the stack the double models, said in its record
        record = spec.stack.named_in(record)
    elif spec.serving is Engine.SGLANG:  # the engine it answers as, said in its record
        from pytest_sharedkv.stack.launch.sglang_dialect import engine_fact

        record = replace(record, stack=engine_fact(None))
    a, b = replicas["A"], replicas["B"]
    metrics = {n: f"{r.base_url}/server/metrics" for n, r in replicas.items()}
    views = ([ServerView("server 1", a.logs, (metrics["A"],), spec.count_evictions),
              ServerView("server 2", b.logs, (metrics["B"],), spec.count_evictions)]
             if hosts else [ServerView("server", lambda: a.logs() + b.logs(),
                                       tuple(metrics.values()), spec.count_evictions)])
    pair = ReplicaPair(a, b, record,
                       relaunch=lambda **changes: stub_pair(replace(spec, **changes)),
                       topology=topology_of(replace(spec, hosts=hosts), views)
                       if spec.arm == "ON" else None)
    start_all(pair, together=True)  # stops both if one fails
    if hosts is not None:
        _attached(pair, hosts)
    pair.starts = start_record([], pair.replicas)
    pair.gpu_kv_tokens = gpu_kv_capacity(pair.replicas)
    return pair


def _dialect(spec: LaunchSpec) -> dict[str, Any]:
    """The Replica fields that read an SGLang stub's answers and counters as SGLang's."""
    if spec.serving is not Engine.SGLANG:
        return {}
    from pytest_sharedkv.stack.launch.sglang_dialect import sglang_answer, sglang_counters

    return {"counters_from": sglang_counters, "answer_shape": sglang_answer}


def stub_l1_blocks(spec: LaunchSpec) -> int | None:
    """The stub's L1 in blocks: SPEC's L1 size at STUB_TOKEN_BYTES a token, where the
    launch counts evictions (an L1 size given, or the hosts topology); None: unbounded."""
    if not spec.count_evictions:
        return None
    from pytest_sharedkv.stack.stub.stub_openai import STUB_TOKEN_BYTES

    return max(1, int(spec.l1_size_gb * (1 << 30)) // (spec.chunk_size * STUB_TOKEN_BYTES))


def _attached(pair: ReplicaPair, hosts: HostsSpec) -> None:
    """Each stub's server logged its L2 attached (as an LMCache server's start is judged);
    L2NotAttached names the adapter and the line, the pair stopped."""
    from pytest_sharedkv.stack.l2.log import l2_attach_error
    from pytest_sharedkv.stack.lmcache_server import L2NotAttached

    for (name, replica), adapter in zip(pair.replicas.items(), hosts.adapters, strict=True):
        why = l2_attach_error(replica.logs(), (adapter,))
        if why is not None:
            pair.close()
            raise L2NotAttached(f"stub replica {name}'s server started without its L2: {why}"
                                + (f" (log: {replica.process.log_path})"
                                   if replica.process is not None else ""))


def external_pair(endpoints: tuple[str, ...]) -> ReplicaPair:
    """Two replicas the suite neither started nor can stop: their URLs are all it knows
    (allocator, engine, devices, model: unknown)."""
    if len(endpoints) != 2:
        raise ValueError(f"--sharedkv-endpoints needs two URLs (A,B), got {len(endpoints)}")
    urls = [url.rstrip("/") for url in endpoints]
    a, b = (Replica(name, url) for name, url in zip(("A", "B"), urls, strict=True))
    record = LaunchRecord(provider="external",
                          description=f"external {endpoints[0]}, {endpoints[1]}",
                          replicas=tuple(ReplicaLaunch(name, url)
                                         for name, url in zip(("A", "B"), urls, strict=True)))
    return ReplicaPair(a, b, record)
