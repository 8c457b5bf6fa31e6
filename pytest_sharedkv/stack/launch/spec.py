"""What a launch is asked for, in one module that imports no provider and no stack:
``LaunchSpec`` (where to log, which devices and model, which arm, the faults and controls,
the hosts topology's L2, the stack's additions, the identity tier's replicas, the serving
engine), ``StackLaunch`` (what a stack adds to each replica and to the record: the
interface every stack fills in, which the providers read and never call back through),
the in-process stack's planned Redis, the served context (``max_model_len``), and the
paths a launch writes (the gate's control file and log, the audit's directory, the delay
and sync logs)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.config.engine import Engine
from pytest_sharedkv.layouts.chunk_size import DEFAULT_CHUNK
from pytest_sharedkv.stack.engine_settings import EngineSettings
from pytest_sharedkv.stack.faults import StubFaults

if TYPE_CHECKING:
    from pytest_sharedkv.stack.l2.redis_server import RedisServer
    from pytest_sharedkv.stack.launch.identity_launch import StubIdentity
    from pytest_sharedkv.stack.launch.inprocess_connector import InprocessLaunch
    from pytest_sharedkv.stack.launch_record import LaunchRecord
    from pytest_sharedkv.stack.topology import HostsSpec


INJECT_DIR = Path(__file__).resolve().parents[2] / "engine_hooks" / "inject"
# with the shared LMCache pool / GPU prefix caching alone / vLLM's own CPU offloading
# (one pool of l1_size_gb per replica, not shared)
LAUNCH_ARMS = ("ON", "OFF", "NATIVE")



MIN_MODEL_LEN = 4096  # the served context a launched pair gets at least
ANSWER_MARGIN = 64  # tokens of slack past prompt and answer


def max_model_len(longest_prompt: int, answer_tokens: int, model: Path | None) -> int:
    """The served context a pair needs (vLLM's --max-model-len): the longest prompt it is
    sent plus its answer and a margin, at least MIN_MODEL_LEN, and never past the context
    the model was built for (its config.json) where that is known."""
    from pytest_sharedkv.models.config_file import max_position_embeddings

    need = max(MIN_MODEL_LEN, longest_prompt + answer_tokens + ANSWER_MARGIN)
    return min(need, max_position_embeddings(model, need))


@dataclass(frozen=True)
class LaunchSpec:
    """What a launched pair needs: where to log, which devices, which model, faults."""

    log_dir: Path
    allocator: str = "mixed"
    model: Path | None = None
    devices: tuple[str, ...] = ()
    inject_delay_cycles: int = 0
    chunk_size: int = DEFAULT_CHUNK  # the launchers pass the model's (derive_chunk_size)
    l1_size_gb: float = 8.0
    max_model_len: int = MIN_MODEL_LEN
    engine: EngineSettings = field(default_factory=EngineSettings)
    ready_timeout: float = 900.0
    gate: bool = True  # arm the service tier's sensitivity gate in the LMCache server
    kv_audit: bool = False  # digest the KV each replica stores and loads (kv_audit_hook)
    arm: str = "ON"  # OFF: no LMCache server, no connector, no pool (the perf baseline)
    stub_prefill_us: float = 0.0  # stub only: simulated prefill per uncached prompt token
    stub_faults: StubFaults = field(default_factory=StubFaults)  # stub only: self-tests
    # the service triage's controls: variables set in the LMCache server / both replicas,
    # and a device synchronize around every KV transfer in the server (sync_hook)
    server_env: tuple[tuple[str, str], ...] = ()
    replica_env: tuple[tuple[str, str], ...] = ()
    sync_transfers: bool = False
    # each replica's VLLM_CACHE_ROOT (compiled graphs) is <compile_cache>/<A|B>: two engines
    # compiling at once never write one directory, and the next block's start of a replica
    # finds what it compiled; None: vLLM's default (~/.cache/vllm)
    compile_cache: Path | None = None
    # the hosts topology: one LMCache server per replica sharing this L2 (None: one server
    # both replicas share); count_evictions: each server counts its L1 evictions (its
    # observability on; the stub's L1 then holds l1_size_gb at STUB_TOKEN_BYTES a token)
    hosts: HostsSpec | None = None
    count_evictions: bool = False
    # --sharedkv-stack inprocess|native (stack/launch/stacks.py): each replica's extra flags
    # and variables and the record's naming of the stack; None: the MP server's stack
    stack: StackLaunch | None = None
    # the identity tier: what each stub replica serves as (stack/launch/identity_launch.py)
    identity: StubIdentity | None = None
    # --sharedkv-engine: the engine in each replica (stack/launch/sglang_engine.py for SGLang;
    # the stub double answers as it does)
    serving: Engine = Engine.VLLM

    def __post_init__(self) -> None:
        if self.arm not in LAUNCH_ARMS:
            raise ValueError(f"arm must be one of {LAUNCH_ARMS}, not {self.arm!r}")


def gate_paths(log_dir: Path) -> tuple[Path, Path]:
    """(control file, log) of the sensitivity gate's hook in the LMCache server."""
    return log_dir / "gate-control.json", log_dir / "gate-zeroed.log"


def audit_dir(log_dir: Path) -> Path:
    """Where the replicas' in-engine KV audit writes its digest logs."""
    return log_dir / "kv-audit"


def sync_log(log_dir: Path) -> Path:
    """Where the server logs each synchronized KV transfer (the triage's sync control)."""
    return log_dir / "sync-transfers.log"


def inject_log(log_dir: Path) -> Path:
    """Where the launched processes log each delayed call (fault-sensitivity mode)."""
    return log_dir / "inject-delay.log"



class StackUnavailable(RuntimeError):
    """The stack cannot be launched here (no redis-server or no redis-py for the
    in-process stack's Redis, a corpus that fits the GPU)."""


@dataclass(frozen=True)
class StackLaunch:
    """What a stack adds to each launched replica and to the launch record."""

    name: str
    arm: str
    flags: tuple[str, ...] = ()
    envs: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # per replica
    record: Mapping[str, Any] = field(default_factory=dict)
    description: str | None = None
    allocator: str | None = None
    backend: PlannedRedis | None = None  # started before the pair, stopped after it
    inprocess: InprocessLaunch | None = None  # its config files, written before the start
    # the sensitivity gate: (control file, log) of the replica hook, or None: no gate here
    gate: tuple[Path, Path] | None = None

    def replica_argv(self, argv: Sequence[str], extra_args: Sequence[str]) -> list[str]:
        """ARGV with the stack's flags before the user's own (EXTRA_ARGS, last)."""
        cut = len(argv) - len(extra_args)
        return [*argv[:cut], *self.flags, *argv[cut:]]

    def replica_env(self, name: str) -> dict[str, str]:
        """NAME's variables; where one arms a hook, the hooks' directory first on its
        path (a launched replica's environment is the run's, so its path is too)."""
        from pytest_sharedkv.engine_hooks.switches import arms_a_hook

        env = dict(dict(self.envs).get(name, ()))
        if arms_a_hook(env.items()):
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(INJECT_DIR), os.environ.get("PYTHONPATH", "")) if p)
        return env

    def named_in(self, record: LaunchRecord) -> LaunchRecord:
        """RECORD naming this stack; its gate's paths are this stack's (none where the
        record says "gate": "none")."""
        changes: dict[str, Any] = {"stack": dict(self.record)}
        if self.gate is not None or self.record.get("gate") == "none":
            control, log = self.gate or (None, None)
            changes["paths"] = replace(record.paths, gate_control=control, gate_log=log)
        if self.description is not None:
            changes["description"] = self.description
        if self.allocator is not None:
            changes["allocator"] = self.allocator
        return replace(record, **changes)


class PlannedRedis:
    """The in-process stack's Redis as a plan has it: a free port on 127.0.0.1, nothing
    looked for; the binary and the client are found when it starts (``launch_stack_pair``),
    StackUnavailable naming what is missing. Planning a launch needs no Redis."""

    def __init__(self, log_dir: Path) -> None:
        from pytest_sharedkv.processes.managed import free_port
        from pytest_sharedkv.stack.l2.redis_server import HOST

        self.log_dir = log_dir
        self.host = HOST
        self.port = free_port()
        self.server: RedisServer | None = None

    def start(self) -> PlannedRedis:
        from pytest_sharedkv.stack.l2.redis_server import (
            MISSING,
            RedisServer,
            client_missing,
            find_redis_server,
        )

        binary = find_redis_server()
        why = MISSING if binary is None else client_missing()
        if binary is None or why is not None:
            raise StackUnavailable(f"--sharedkv-stack inprocess: {why}")
        self.server = RedisServer(binary, self.log_dir, port=self.port).start()
        return self

    def stop(self) -> list[int]:
        return [] if self.server is None else self.server.stop()
