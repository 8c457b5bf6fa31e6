"""The real LMCache multiprocess server, launched on 127.0.0.1 with free ports.

``lmcache server`` (lmcache 0.5.6 CLI): ``--l1-use-lazy`` (the default: LazyMemoryAllocator,
whose copies go through ``lmcache_memcpy_async``) or ``--no-l1-use-lazy``
(MixedMemoryAllocator, stream-aware tensor copies). The chunk size must be a multiple of
the engine's block size. Where pinning is unsupported (no CUDA) LMCache itself turns lazy
off; the server's effective allocator is read from its log and reported.

With ``l2_adapters`` (``--l2-adapter`` JSON, ``stack/l2/backends.py`` makes them) servers on
different hosts share KV through an L2; a server that answers ``/`` but serves without its L2 is a
start failure (``stack/l2/log.py`` reads why from its log).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_sharedkv.layouts.chunk_size import DEFAULT_CHUNK
from pytest_sharedkv.processes.managed import (
    ManagedProcess,
    ProcessFailed,
    free_port,
    http_ok,
    tcp_open,
)
from pytest_sharedkv.stack.l2 import log as l2_log

ALLOCATORS = ("lazy", "mixed")
LAZY_DISABLED = "Disabling l1-use-lazy"
SERVER_ENV = {
    "LMCACHE_DISABLE_BANNER": "1",
    "LMCACHE_TRACK_USAGE": "false",  # no usage telemetry from test servers
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}

# LMCache's MP server stores asynchronously after the engine answers: time per prompt token
# on an H200, with margin (a cross-replica request sent sooner finds a partial entry).
STORE_S_PER_TOKEN = 40e-6

# What a run that found the lazy allocator's fault suggests, where nothing in that run
# proved a remedy (the service tier names one as proven only where a triage cell, the other
# allocator's pair or a --sharedkv-baseline report proved it).
LAZY_REMEDY = ("suggestion (not proven by this run): start the server with "
               "--no-l1-use-lazy, or run LMCache's compiled cuda_ops (a build that loads "
               "against this torch)")


@dataclass(frozen=True)
class ServerConfig:
    allocator: str = "mixed"
    l1_size_gb: float = 1.0
    chunk_size: int = DEFAULT_CHUNK  # the pair's launcher passes the model's
    eviction_policy: str = "LRU"
    ready_timeout: float = 120.0
    l2_adapters: tuple[str, ...] = ()  # each an --l2-adapter JSON object with a "type"
    # its observability on, so its HTTP /metrics counts L1 evictions (topology.l1_evictions);
    # off by default, as the server has always been launched
    count_evictions: bool = False
    # why evictions are not counted although they were asked for (count_evictions then
    # False): the server's metrics need a package this host lacks; "" where nothing stopped it
    uncounted: str = ""

    def __post_init__(self) -> None:
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {ALLOCATORS}, not {self.allocator!r}")
        for adapter in self.l2_adapters:
            try:
                spec = json.loads(adapter)
            except ValueError as exc:
                raise ValueError(f"L2 adapter {adapter!r} is not JSON: {exc}") from None
            if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
                raise ValueError(f"L2 adapter {adapter!r} is not a JSON object with a \"type\"")


# LMCache 0.5.6 starts its metrics with observability on (mp_observability/otel_init.py:105
# imports it) and exits with status 3 when it is missing: measured on the H200 host
METRICS_EXPORTER = "opentelemetry.exporter.prometheus"
METRICS_EXPORTER_PACKAGE = "opentelemetry-exporter-prometheus"


def eviction_counting_problem() -> str:
    """Why a server launched from this interpreter cannot count its L1 evictions ("" when
    it can): LMCache's observability imports the Prometheus exporter at start."""
    import importlib.util

    try:
        found = importlib.util.find_spec(METRICS_EXPORTER) is not None
    except (ImportError, ValueError):  # a parent package missing
        found = False
    return "" if found else (f"LMCache's eviction counter needs the PyPI package "
                             f"{METRICS_EXPORTER_PACKAGE}, which this host lacks "
                             f"({METRICS_EXPORTER} does not import)")


class L2NotAttached(ProcessFailed):
    """The server started (its HTTP / answers) but serves without an L2 it was given."""


REGISTER_FAILED = "Error handling operation register_kv_cache"  # LMCache 0.5.6 mq.py


class LMCacheServer:
    def __init__(self, config: ServerConfig, log_dir: Path,
                 env: dict[str, str] | None = None, role: str = "",
                 prefix: Sequence[str] = ()) -> None:
        """PREFIX runs before the server's own argv (``mount_ns.CappedTmpfs.enter``: the
        server inside a private mount namespace)."""
        self.config = config
        self.port = free_port()
        self.http_port = free_port()
        argv = [
            sys.executable, "-c", "from lmcache.cli.main import main; main()", "server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--l1-size-gb", f"{config.l1_size_gb:g}",
            "--eviction-policy", config.eviction_policy,
            "--chunk-size", str(config.chunk_size),
            "--l1-use-lazy" if config.allocator == "lazy" else "--no-l1-use-lazy",
            "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
        ]
        if not config.count_evictions:
            argv += ["--disable-observability", "--disable-metrics"]
        for adapter in config.l2_adapters:
            argv += ["--l2-adapter", adapter]
        full_env = {**(os.environ if env is None else env), **SERVER_ENV}
        if config.l2_adapters:  # the attach and retained-keys lines are INFO
            full_env["LMCACHE_LOG_LEVEL"] = "INFO"
        name = f"lmcache server {role}" if role else "lmcache server"  # role: "1", "2"
        self.process = ManagedProcess(f"{name} ({config.allocator})", [*prefix, *argv],
                                      log_dir / f"lmcache-server-{self.port}.log", env=full_env)
        self.startup_s: float | None = None
        self._scanned = 0  # bytes of the log fatal_error has already read
        self._failure_seen = False

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """Its OTel counters in Prometheus text (with observability on: count_evictions)."""
        return self.http_url + "/metrics"

    def _ready(self) -> bool:
        # the zmq port accepting and the HTTP API answering (log levels may hide the
        # "cache server is running" line, so it is not required)
        return tcp_open(self.port) and http_ok(self.http_url + "/")

    def start(self) -> LMCacheServer:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Start the process without waiting (what else starts meanwhile overlaps it)."""
        self.process.start()

    def wait_ready(self) -> None:
        """Ready, and attached to every L2 adapter it was given (L2NotAttached names the
        adapter and the log line otherwise)."""
        self.startup_s = self.process.wait_ready(self._ready, self.config.ready_timeout,
                                                 "ready (HTTP / and the zmq server)")
        why = self.l2_error()
        if why is not None:
            raise L2NotAttached(f"{self.process.name} on {self.url} started without its L2: "
                                f"{why} (log: {self.process.log_path})")

    def l2_error(self) -> str | None:
        """Why this server serves without one of its L2 adapters (so far), or None."""
        if not self.config.l2_adapters:
            return None
        return l2_log.l2_attach_error(self.process.log_text(), self.config.l2_adapters)

    def key_split(self, request_id: str) -> l2_log.KeySplit:
        """Where the keys of lookup REQUEST_ID came from (L1 or L2), in the server's log."""
        return l2_log.key_split(self.process.log_text(), request_id)

    def fatal_error(self) -> str | None:
        """Why an engine cannot register with this server, or None: LMCache logs a failed
        ``register_kv_cache`` and goes on serving, while the engine waits for an answer
        forever (seen on an H200 pair: the server could not see the second replica's GPU).
        Reads only what the log gained since the last call (server logs reach 30 MB)."""
        if not self.process.alive():
            return f"the LMCache server exited (log: {self.process.log_path})"
        try:
            with self.process.log_path.open("rb") as log:
                log.seek(self._scanned)
                new = log.read()
        except OSError:
            return None
        at = new.find(REGISTER_FAILED.encode())
        if at < 0:
            # keep a pattern's length so one split across two reads is still found
            self._scanned += max(0, len(new) - len(REGISTER_FAILED))
            return None
        after = new[at:].decode(errors="replace").splitlines()[1:]
        cause = next((line.strip() for line in after
                      if line[:1].isalpha() and ("Error" in line or "Exception" in line)), None)
        if cause is None and not self._failure_seen:
            self._failure_seen = True  # its traceback may be half written: look once more
            return None
        return (f"the LMCache server failed register_kv_cache: {cause or 'see its log'} "
                f"(log: {self.process.log_path})")

    def effective_allocator(self) -> str:
        if self.config.allocator == "lazy" and LAZY_DISABLED in self.process.log_text():
            return "mixed (LMCache disabled lazy: pinning unsupported here)"
        return self.config.allocator

    def health(self) -> dict[str, object]:
        with urllib.request.urlopen(self.http_url + "/", timeout=5) as response:
            data: dict[str, object] = json.loads(response.read())
        return data

    def stop(self) -> list[int]:
        return self.process.stop()
