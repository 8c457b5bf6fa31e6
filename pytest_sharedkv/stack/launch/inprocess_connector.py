"""LMCache's in-process connector as a replica pair's launch configuration: two vLLM
replicas with ``LMCacheConnectorV1``, each with its own ``local_cpu`` (and optionally
``local_disk``) tier, sharing KV through one remote backend the suite started (a Redis
through ``redis://``, or LMCache's own ``lm://`` server). The deployment most LMCache users
run, and the one LMCache's own correctness CI shares KV with (two instances over Redis).

From explicit inputs this builds what the launcher needs, validated before anything starts:
each replica's ``LMCACHE_CONFIG_FILE`` (YAML), its environment and the vLLM flags, as a
frozen record the launch record can hold. Read from LMCache 0.5.6 and vLLM 0.26.0:

* vLLM picks the connector by name (``kv_connector: LMCacheConnectorV1``) and, without
  ``use_native`` in its extra config, loads LMCache's own adapter
  (``lmcache.integration.vllm.vllm_v1_adapter.LMCacheConnectorV1Impl``), which reads the
  file ``LMCACHE_CONFIG_FILE`` names (``integration/vllm/utils.py``
  ``lmcache_get_or_create_config``); ``lmcache.``-prefixed extra-config keys override it.
* Two processes find each other's chunks only where their keys agree: LMCache hashes
  tokens with vLLM's hash function and vLLM seeds its ``NONE_HASH`` from
  ``PYTHONHASHSEED`` (random per process when unset), so both replicas get one seed and
  ``sha256_cbor`` (``lmcache/v1/token_database.py``, ``vllm/v1/core/kv_cache_utils.py``
  ``init_none_hash``).
* vLLM 0.26 refuses a hybrid (Gated DeltaNet) model with this connector at startup: it does
  not implement ``SupportsHMA``, so the hybrid KV cache manager is turned off and the KV
  specs cannot be unified. The attention-only copy model
  (``models/copy_attention_model.py``) is what it serves.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pytest_sharedkv.engine_hooks import kv_audit_hook

CONNECTOR = "LMCacheConnectorV1"
# where the KV caches vLLM registers reach LMCache's in-process adapter (LMCache 0.5.6,
# integration/vllm/lmcache_connector_v1.py hands them to vllm_v1_adapter.py's, which keeps
# them for its LMCacheEngine): not LMCacheMPConnector.register_kv_caches, which the KV
# audit's hook wraps
REGISTRATION = ("lmcache.integration.vllm.vllm_v1_adapter:"
                "LMCacheConnectorV1Impl.register_kv_caches")
# why this stack runs without the KV audit (its launch record's "kv_audit", the service
# tier's n/a): its replicas are launched without it
NO_AUDIT = (
    f"the KV audit's hook (engine_hooks/kv_audit_hook.py) wraps LMCache's MP connector, "
    f"{kv_audit_hook.REGISTRATION} (and its {', '.join(kv_audit_hook.METHODS[1:])}), and "
    f"the in-process connector {CONNECTOR} registers its KV caches through {REGISTRATION} "
    "and stores and loads through its own LMCacheEngine, never calling those (LMCache "
    "0.5.6), so the audit does not carry over to this stack and its replicas are launched "
    "without it")
CONFIG_ENV = "LMCACHE_CONFIG_FILE"
REMOTE_ENV = "LMCACHE_REMOTE_URL"  # overrides the file's remote_url (update_config_from_env)
HASH_SEED = "0"  # PYTHONHASHSEED, the same in both replicas: their chunk keys agree
HASH_ALGORITHM = "sha256_cbor"
REMOTE_SCHEMES = ("redis", "lm")  # a Redis the suite started, LMCache's own server
SERDES = ("naive", "cachegen")
REPLICAS = ("A", "B")
REPLICA_ENV = {
    "PYTHONHASHSEED": HASH_SEED,
    "LMCACHE_DISABLE_BANNER": "1",
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
}


class InprocessConfigError(ValueError):
    """A value the configuration cannot run with; ``field`` names the input (the option
    that gave it is the caller's to name)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class InprocessSettings:
    """What each replica's LMCache keeps and where the pair shares. Sizes are per replica,
    in GB as LMCache reads them; ``local_disk`` None: no disk tier; ``remote_url`` None: no
    sharing (each replica's tiers serve only itself)."""

    chunk_size: int
    local_cpu_gb: float
    local_disk: Path | None = None
    local_disk_gb: float = 0.0
    remote_url: str | None = None
    remote_serde: str = "naive"
    save_unfull_chunk: bool = False
    prefix_caching: bool = True  # vLLM's own GPU prefix cache beside LMCache's tiers
    engine_block: int | None = None  # vLLM's block: the chunk must be whole blocks

    def problems(self) -> list[InprocessConfigError]:
        """Every input that cannot run, each naming its field; [] where all can."""
        found = []
        if self.chunk_size <= 0:
            found.append(InprocessConfigError("chunk_size",
                                              f"must be > 0, not {self.chunk_size}"))
        elif self.engine_block and self.chunk_size % self.engine_block:
            found.append(InprocessConfigError(
                "chunk_size", f"{self.chunk_size} is not a multiple of the engine's "
                f"{self.engine_block}-token block"))
        if not self.local_cpu_gb > 0:
            found.append(InprocessConfigError(
                "local_cpu_gb", f"must be > 0, not {self.local_cpu_gb:g} (LMCache's remote "
                "and disk tiers stage through the CPU tier)"))
        if self.local_disk is not None:
            if not self.local_disk_gb > 0:
                found.append(InprocessConfigError(
                    "local_disk_gb", f"must be > 0 with a disk tier, not "
                    f"{self.local_disk_gb:g} (LMCache skips the tier at 0)"))
            problem = writable_problem(self.local_disk)
            if problem is not None:
                found.append(InprocessConfigError("local_disk", problem))
        elif self.local_disk_gb:
            found.append(InprocessConfigError(
                "local_disk_gb", f"{self.local_disk_gb:g} GB given but no local_disk path"))
        if self.remote_url is not None:
            problem = remote_problem(self.remote_url)
            if problem is not None:
                found.append(InprocessConfigError("remote_url", problem))
        if self.remote_serde not in SERDES:
            found.append(InprocessConfigError(
                "remote_serde", f"one of {', '.join(SERDES)}, not {self.remote_serde!r}"))
        return found


def writable_problem(path: Path) -> str | None:
    """Why LMCache could not keep files under PATH, or None: its nearest existing folder
    takes a file (a probe made and removed there; permission bits do not tell for root)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{path}: {probe} is not a directory"
    try:
        fd, name = tempfile.mkstemp(prefix=".sharedkv-probe-", dir=probe)
    except OSError as exc:
        return f"{path}: no file can be made in {probe} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(name)
    return None


def remote_problem(url: str) -> str | None:
    """Why URL is not a remote the pair can share through, or None."""
    parts = urlsplit(url)
    if parts.scheme not in REMOTE_SCHEMES:
        return (f"{url!r}: the scheme must be one of "
                f"{', '.join(s + '://' for s in REMOTE_SCHEMES)}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        return f"{url!r}: needs a host and a port (e.g. {parts.scheme}://127.0.0.1:6379)"
    return None


def redis_url(host: str, port: int) -> str:
    """The ``remote_url`` of a Redis the suite started (``stack.l2.RedisL2``'s host, port)."""
    return f"redis://{host}:{port}"


def lm_server_argv(python: str, port: int, host: str = "127.0.0.1") -> list[str]:
    """LMCache's own remote server (``lm://``), as 0.5.6 starts it:
    ``python -m lmcache.v1.server HOST PORT cpu``."""
    return [python, "-m", "lmcache.v1.server", host, str(port), "cpu"]


def config_values(settings: InprocessSettings, replica: str) -> dict[str, Any]:
    """The LMCache configuration REPLICA reads (its keys as ``lmcache/v1/config.py``
    defines them); each replica's disk tier is a directory of its own."""
    values: dict[str, Any] = {
        "chunk_size": settings.chunk_size,
        "local_cpu": True,
        "max_local_cpu_size": float(settings.local_cpu_gb),
        "save_unfull_chunk": settings.save_unfull_chunk,
        "pre_caching_hash_algorithm": HASH_ALGORITHM,
    }
    if settings.local_disk is not None:
        values["local_disk"] = str(settings.local_disk / replica)
        values["max_local_disk_size"] = float(settings.local_disk_gb)
    if settings.remote_url is not None:
        values["remote_url"] = settings.remote_url
        values["remote_serde"] = settings.remote_serde
    return values


def yaml_text(values: Mapping[str, Any]) -> str:
    """VALUES as YAML, one ``key: value`` a line; each value in JSON form, which YAML
    reads as the same scalar (floats keep their point: YAML 1.1 reads ``1e3`` as text)."""
    lines = []
    for key, value in values.items():
        if isinstance(value, float):
            text = repr(value) if "e" not in repr(value) else f"{value:.6f}"
        else:
            text = json.dumps(value)
        lines.append(f"{key}: {text}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class InprocessReplica:
    """One replica's part: its config file (path and text) and the variables it gets."""

    name: str
    config_file: Path
    config_text: str
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class InprocessLaunch:
    """The pair's in-process configuration, validated: what the launch record holds."""

    settings: InprocessSettings
    replicas: tuple[InprocessReplica, ...]
    transfer_config: tuple[tuple[str, Any], ...] = field(default=(
        ("kv_connector", CONNECTOR), ("kv_role", "kv_both")))

    def replica(self, name: str) -> InprocessReplica:
        return next(r for r in self.replicas if r.name == name)

    def argv(self) -> list[str]:
        """The vLLM flags of either replica (the same for both)."""
        flags = ["--kv-transfer-config", json.dumps(dict(self.transfer_config))]
        return flags if self.settings.prefix_caching else [*flags,
                                                          "--no-enable-prefix-caching"]

    def env(self, name: str) -> dict[str, str]:
        return dict(self.replica(name).env)

    def write(self) -> None:
        """Write each replica's config file; one that exists with other text is refused
        (a file of another run or the user's is never overwritten)."""
        for replica in self.replicas:
            path = replica.config_file
            if path.exists() and path.read_text() != replica.config_text:
                raise InprocessConfigError(
                    "config_file", f"{path} exists with other contents; not overwritten")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(replica.config_text)

    @property
    def backend(self) -> str:
        """What the pair shares through, in words for a report."""
        remote = self.settings.remote_url
        return urlsplit(remote).scheme + "://" if remote else "none (each replica alone)"

    def record(self) -> dict[str, Any]:
        """The configuration as a report keeps it (``compare`` reads the connector and
        backend back); paths as text."""
        return {"connector": CONNECTOR, "backend": self.backend,
                "remote_url": self.settings.remote_url,
                "prefix_caching": self.settings.prefix_caching,
                "replicas": {r.name: {"config_file": str(r.config_file),
                                      "config": config_values(self.settings, r.name)}
                             for r in self.replicas}}


def inprocess_launch(settings: InprocessSettings, config_dir: Path) -> InprocessLaunch:
    """The pair's configuration (config files under CONFIG_DIR, written by ``write``);
    InprocessConfigError names the first input that cannot run."""
    problems = settings.problems()
    if problems:
        raise problems[0]
    replicas = []
    for name in REPLICAS:
        path = config_dir / f"lmcache-{name}.yaml"
        env = {**REPLICA_ENV, CONFIG_ENV: str(path)}
        if settings.remote_url is not None:  # the file's value again, as LMCache reads a
            env[REMOTE_ENV] = settings.remote_url  # variable: the launch record names it
        replicas.append(InprocessReplica(name, path,
                                         yaml_text(config_values(settings, name)),
                                         tuple(sorted(env.items()))))
    return InprocessLaunch(settings, tuple(replicas))
