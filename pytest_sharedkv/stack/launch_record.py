"""What a provider brought into being, as one frozen record: every process it launched
(argv and the environment it set), each replica's address, devices, port and log, the
engine settings and the LMCache server's configuration, and the paths the tiers read
(the gate's control file, the KV audit's logs, the delay log).

A provider builds it once and the pair is constructed with it, so no provider sets the
pair's attributes one by one and every reader (the report's launch facts, the perf
screening's ``launches``, the service tier's paths) reads the same record. For external
endpoints a field the suite cannot know is None (unknown), never a guess.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.engine_hooks.delay_hook import cycles_label

if TYPE_CHECKING:  # the record only holds them
    from pytest_sharedkv.stack.engine_settings import EngineSettings
    from pytest_sharedkv.stack.lmcache_server import ServerConfig

UNKNOWN = "unknown"  # how a report key says a value the suite could not know


@dataclass(frozen=True)
class Launched:
    """One process the suite launched: its name, argv, and the environment variables the
    suite set or changed for it (the rest is the caller's environment, not recorded)."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "argv": list(self.argv), "env": dict(self.env)}


def launched(name: str, argv: list[str], env: Mapping[str, str],
             base: Mapping[str, str] | None = None) -> Launched:
    """NAME's command line, with the variables ENV sets beyond BASE (os.environ)."""
    base = os.environ if base is None else base
    return Launched(name, tuple(argv),
                    tuple(sorted((k, v) for k, v in env.items() if base.get(k) != v)))


@dataclass(frozen=True)
class ReplicaLaunch:
    """One replica as far as the suite knows it. ``url``: where it serves (None: it serves
    nothing, as the transfer provider's clients); ``devices``: the CUDA devices a launched
    engine got (() where it inherited the run's), None where the suite placed no engine
    (a stub double, external endpoints); ``port``/``log``: None where it started nothing."""

    name: str
    url: str | None
    devices: tuple[str, ...] | None = None
    port: int | None = None
    log: Path | None = None


@dataclass(frozen=True)
class LaunchPaths:
    """Where the launched processes read and write what the tiers look at; None where
    nothing of the kind was set up (or, for external endpoints, could be)."""

    log_dir: Path | None = None
    gate_control: Path | None = None  # the sensitivity gate's control file (the server's hook)
    gate_log: Path | None = None  # the chunks the gate's hook zeroed
    kv_audit_dir: Path | None = None  # the replicas' in-engine KV audit logs
    sync_log: Path | None = None  # the server's synchronized transfers (the triage's control)
    inject_log: Path | None = None  # each delayed call (fault-sensitivity mode)


@dataclass(frozen=True)
class LaunchRecord:
    """What one provider call launched, or for external endpoints what is known of them.

    ``provider``, ``allocator`` and ``delay_cycles`` make the report's key (``labels``);
    ``allocator`` is the server's effective one (LMCache may turn lazy off), or what the
    arm has instead of a pool, None where unknown. ``engine``: the flags that shape a
    number, None where unknown. ``server``: the LMCache server's configuration, None where
    none was launched. ``arm``: the perf arm it was launched for, None where unknown."""

    provider: str
    description: str
    replicas: tuple[ReplicaLaunch, ...]
    allocator: str | None = None
    delay_cycles: int = 0
    arm: str | None = None
    model: Path | None = None  # the served checkpoint, where the suite launched it
    processes: tuple[Launched, ...] = ()  # in launch order: the server first
    engine: EngineSettings | None = None
    server: ServerConfig | None = None
    paths: LaunchPaths = LaunchPaths()
    # where the KV lives between the replicas: "shared" (one server, SERVER) or "hosts"
    # (one server per replica, HOST_SERVERS in replica order, sharing the L2 named here)
    topology: str = "shared"
    l2: str | None = None
    host_servers: tuple[ServerConfig, ...] = ()
    # the KV stack it runs (--sharedkv-stack inprocess|native: the configuration's record,
    # connector and backend); None: the MP server's, as before the option
    stack: Mapping[str, Any] | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The report's key for what this pair answers: provider, allocator, delay."""
        return {"provider": self.provider, "allocator": self.allocator or UNKNOWN,
                "delay": cycles_label(self.delay_cycles)}

    def launches(self) -> list[dict[str, Any]]:
        """Every launched process as the report keeps it (name, argv, env set)."""
        return [process.record() for process in self.processes]

    def engine_settings(self) -> dict[str, Any]:
        """The engine settings as the report keeps them; {} where unknown."""
        return self.engine.record() if self.engine is not None else {}

    def topology_record(self) -> dict[str, Any]:
        """The topology as the report keeps it: its name, the L2, each server's L1 (GiB)
        and L2 adapters; servers None where the suite launched none."""
        servers = self.host_servers or ((self.server,) if self.server is not None else ())
        return {"topology": self.topology, "l2": self.l2,
                "servers": [{"l1_size_gb": s.l1_size_gb, "l2_adapters": list(s.l2_adapters),
                             "counts_evictions": s.count_evictions,
                             **({"uncounted": s.uncounted} if s.uncounted else {})}
                            for s in servers]
                if servers else None}

    def devices(self) -> dict[str, tuple[str, ...]]:
        """Each engine's devices, for the replicas the suite placed on a GPU."""
        return {r.name: r.devices for r in self.replicas if r.devices is not None}
