"""SGLang replicas over one LMCache MP server (``--sharedkv-engine sglang``).

Read from the SGLang 0.5.17 wheel (``sglang/srt/mem_cache/storage/lmcache/
lmc_radix_cache.py``, ``srt/mem_cache/registry.py``, ``srt/server_args.py``) and LMCache
0.5.6 (``lmcache/integration/sglang/multi_process_adapter.py``):

* ``--enable-lmcache --lmcache-config-file FILE`` builds ``LMCRadixCache``, whose default
  mode on CUDA is MP: ``LMCacheMPConnector`` dials the standalone ``lmcache server`` at the
  YAML's ``mp_host``/``mp_port`` (a bare host:port is ZMQ over TCP), takes the chunk size
  from the server and needs it to be a multiple of ``--page-size``.
* The registry picks ``LMCRadixCache`` only for a model that is neither a hybrid SSM nor
  hybrid SWA: for a Gated DeltaNet hybrid (Qwen3-Next, the copy model) it returns the
  unified radix cache first and ``--enable-lmcache`` does nothing. So an SGLang pair
  serves the attention-only copy model (``make-model --kind copy-attention``).
* Hits: ``usage.prompt_tokens_details.cached_tokens`` with ``--enable-cache-report``
  (left out when nothing was cached), and with ``--enable-metrics`` the counter
  ``sglang:cached_tokens_total`` by ``cache_source``: ``device`` the radix cache's own
  hits, ``host`` (and ``storage_*``) what ``init_load_back`` loaded, LMCache's.
* ``cache_salt`` reaches SGLang's own radix key (``extra_key``) but not LMCache: the
  adapter's ``_create_key`` builds ``IPCCacheServerKey`` without it (SGLang #37160).

The plan (``plan_sglang_pair``) is a pure function of the launch spec and ports, so a
CPU self-test reads every argv and variable; ``launch_sglang_pair`` starts it through the
same managed processes, leases and group kill as the vLLM pair.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.stack.launch.sglang_dialect import (
    SGLANG_VERSION,
    engine_fact,
    sglang_answer,
    sglang_counters,
)
from pytest_sharedkv.stack.launch_record import LaunchPaths, LaunchRecord, ReplicaLaunch, launched
from pytest_sharedkv.stack.pair import Replica, ReplicaPair, start_all

if TYPE_CHECKING:
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

SERVED_NAME = "sharedkv-model"
PAGE_SIZE = 16  # SGLang's --page-size; LMCache's chunk must be a multiple of it
# sgl_kernel 0.4.5's FA3 library (flash_ops.abi3.so, 1.12 GB) does not travel to the GPU
# host (contrib/gpu-host/make-sglang-bundle.sh); triton attention needs none of it, and
# the pytorch sampler needs no FlashInfer JIT
ATTENTION_BACKEND = "triton"
SAMPLING_BACKEND = "pytorch"


@dataclass(frozen=True)
class PlannedProcess:
    """One process of an SGLang pair: its name, argv, the variables the suite sets for it
    (beyond the caller's environment), where it logs, and the file it reads (the LMCache
    YAML) with that file's text."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    log: Path
    port: int
    config_file: Path | None = None
    config_text: str = ""
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SGLangPlan:
    """A pair's launch: the LMCache server's port both replicas dial, and the replicas."""

    server_port: int
    replicas: tuple[PlannedProcess, PlannedProcess]


def lmcache_yaml(server_port: int) -> str:
    """The ``--lmcache-config-file`` an MP-mode ``LMCRadixCache`` reads (mp_host/mp_port,
    as SGLang's example_config_mp.yaml): the suite's server on 127.0.0.1."""
    return f"mp_host: 127.0.0.1\nmp_port: {server_port}\n"


def sglang_argv(model: Path, port: int, config_file: Path, spec: LaunchSpec) -> list[str]:
    """``python -m sglang.launch_server`` for SGLang 0.5.17 with its LMCache radix cache
    over the suite's server, the hit reports on, on 127.0.0.1."""
    engine = spec.engine
    argv = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
        "--enable-lmcache", "--lmcache-config-file", str(config_file),
        "--enable-cache-report", "--enable-metrics",
        "--page-size", str(PAGE_SIZE), "--context-length", str(spec.max_model_len),
        "--max-running-requests", str(engine.max_num_seqs),
        "--mem-fraction-static", f"{engine.gpu_memory_utilization:g}",
        "--attention-backend", ATTENTION_BACKEND, "--sampling-backend", SAMPLING_BACKEND,
        "--random-seed", "0", "--skip-server-warmup",
    ]
    if engine.enforce_eager:  # 0.5.17: --disable-cuda-graph is a deprecated alias of these
        argv += ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]
    if engine.load_format is not None:
        argv += ["--load-format", engine.load_format]
    return argv


def plan_problem(spec: LaunchSpec) -> str | None:
    """Why SPEC cannot be an SGLang pair, or None (said before anything starts)."""
    if spec.model is None:
        return ("an SGLang pair needs a model (--sharedkv-model, else the attention-only "
                "copy model the service tier makes)")
    if spec.chunk_size % PAGE_SIZE:
        return (f"LMCache's chunk ({spec.chunk_size} tokens) is no multiple of SGLang's page "
                f"({PAGE_SIZE}): LMCacheMPConnector refuses it at start")
    if spec.arm != "ON" or spec.hosts is not None or spec.stack is not None:
        return "an SGLang pair is one LMCache MP server both replicas share (the ON arm)"
    return None


def plan_sglang_pair(spec: LaunchSpec, server_port: int, ports: tuple[int, int],
                     devices: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
                     base_env: Mapping[str, str] | None = None) -> SGLangPlan:
    """The pair SPEC describes over the LMCache server at SERVER_PORT: each replica's argv,
    variables (its devices, the hooks' switches from ``process_env``), log and YAML.
    Raises ValueError with ``plan_problem``'s words where it cannot run."""
    from pytest_sharedkv.stack.launch.providers import process_env

    problem = plan_problem(spec)
    if problem is not None:
        raise ValueError(problem)
    assert spec.model is not None
    planned = []
    for name, port, placed in zip(("A", "B"), ports, devices, strict=True):
        config = spec.log_dir / f"lmcache-sglang-{name}.yaml"
        env = process_env(spec, placed, base=base_env or {}, role=f"replica {name}")
        planned.append(PlannedProcess(
            f"sglang replica {name}", tuple(sglang_argv(spec.model, port, config, spec)),
            tuple(sorted(env.items())), spec.log_dir / f"sglang-{name}-{port}.log", port,
            config, lmcache_yaml(server_port), placed))
    return SGLangPlan(server_port, (planned[0], planned[1]))


def launch_sglang_pair(spec: LaunchSpec) -> ReplicaPair:
    """The LMCache server, then both SGLang replicas (``plan_sglang_pair``), each a
    managed process; a start that fails part way stops what it had started."""
    from pytest_sharedkv.processes.managed import ManagedProcess, free_port
    from pytest_sharedkv.stack.launch.providers import (
        gpu_kv_capacity,
        lmcache_servers,
        replica_devices,
        start_record,
        together,
    )

    problem = plan_problem(spec)
    if problem is not None:
        raise ValueError(problem)
    with ExitStack() as started:
        (server,) = lmcache_servers(spec)
        started.callback(server.stop)
        server.launch()
        server.wait_ready()
        plan = plan_sglang_pair(spec, server.port, (free_port(), free_port()),
                                (replica_devices(spec, 0), replica_devices(spec, 1)))
        replicas: dict[str, Replica] = {}
        for planned in plan.replicas:
            assert planned.config_file is not None
            planned.config_file.write_text(planned.config_text)
            env = {**os.environ, **dict(planned.env)}
            process = ManagedProcess(planned.name, list(planned.argv), planned.log, env=env)
            name = planned.name.rsplit(" ", 1)[-1]
            replicas[name] = Replica(
                name, f"http://127.0.0.1:{planned.port}", process,
                ready_timeout=spec.ready_timeout, model=SERVED_NAME, reports_external=True,
                abort=server.fatal_error, counters_from=sglang_counters,
                answer_shape=sglang_answer)
        pair = ReplicaPair(replicas["A"], replicas["B"], sglang_record(spec, plan, server),
                           stop_server=server.stop,
                           relaunch=lambda **changes: launch_sglang_pair(
                               replace(spec, **changes)))
        started.pop_all()
    start_all(pair, together=together(spec))  # stops the whole pair if a replica fails
    pair.starts = start_record([server], pair.replicas)
    pair.gpu_kv_tokens = gpu_kv_capacity(pair.replicas)
    return pair


def sglang_record(spec: LaunchSpec, plan: SGLangPlan, server: Any) -> LaunchRecord:
    """The launch record of an SGLang pair: the server first, then both replicas, and
    the engine named (``stack``: what ``compare`` reads as the engine)."""
    from pytest_sharedkv.stack.launch.spec import audit_dir, gate_paths, inject_log

    processes = [launched(server.process.name, server.process.argv, server.process.env)]
    processes += [launched(p.name, list(p.argv), dict(p.env), base={}) for p in plan.replicas]
    control, log = gate_paths(spec.log_dir)
    return LaunchRecord(
        provider="sglang", description=f"sglang x2 + lmcache server "
                                       f"({server.effective_allocator()})",
        replicas=tuple(ReplicaLaunch(p.name.rsplit(" ", 1)[-1], f"http://127.0.0.1:{p.port}",
                                     devices=p.devices, port=p.port, log=p.log)
                       for p in plan.replicas),
        allocator=server.effective_allocator(), delay_cycles=spec.inject_delay_cycles,
        arm=spec.arm, model=spec.model, processes=tuple(processes), engine=spec.engine,
        server=server.config,
        paths=LaunchPaths(log_dir=spec.log_dir, gate_control=control if spec.gate else None,
                          gate_log=log if spec.gate else None,
                          kv_audit_dir=audit_dir(spec.log_dir) if spec.kv_audit else None,
                          inject_log=inject_log(spec.log_dir)
                          if spec.inject_delay_cycles else None),
        stack=engine_fact(SGLANG_VERSION))
