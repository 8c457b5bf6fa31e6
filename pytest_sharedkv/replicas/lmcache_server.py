"""The real LMCache multiprocess server, launched on 127.0.0.1 with free ports.

``lmcache server`` (lmcache 0.5.6 CLI): ``--l1-use-lazy`` (the default: LazyMemoryAllocator,
whose copies go through ``lmcache_memcpy_async``) or ``--no-l1-use-lazy``
(MixedMemoryAllocator, stream-aware tensor copies). The chunk size must be a multiple of
the engine's block size. Where pinning is unsupported (no CUDA) LMCache itself turns lazy
off; the server's effective allocator is read from its log and reported.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pytest_sharedkv.replicas.process import ManagedProcess, free_port, http_ok, tcp_open

ALLOCATORS = ("lazy", "mixed")
LAZY_DISABLED = "Disabling l1-use-lazy"
SERVER_ENV = {
    "LMCACHE_DISABLE_BANNER": "1",
    "LMCACHE_TRACK_USAGE": "false",  # no usage telemetry from test servers
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


def chunk_size_for(block_size: int, blocks: int = 2) -> int:
    """LMCache chunks must be whole engine blocks (160 for the tiny hybrid's 80)."""
    return block_size * blocks


@dataclass(frozen=True)
class ServerConfig:
    allocator: str = "mixed"
    l1_size_gb: float = 1.0
    chunk_size: int = 256
    eviction_policy: str = "LRU"
    ready_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {ALLOCATORS}, not {self.allocator!r}")


class LMCacheServer:
    def __init__(self, config: ServerConfig, log_dir: Path,
                 env: dict[str, str] | None = None) -> None:
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
            "--disable-observability", "--disable-metrics",
        ]
        full_env = {**(os.environ if env is None else env), **SERVER_ENV}
        self.process = ManagedProcess(f"lmcache server ({config.allocator})", argv,
                                      log_dir / f"lmcache-server-{self.port}.log", env=full_env)
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _ready(self) -> bool:
        # the zmq port accepting and the HTTP API answering (log levels may hide the
        # "cache server is running" line, so it is not required)
        return tcp_open(self.port) and http_ok(self.http_url + "/")

    def start(self) -> LMCacheServer:
        self.process.start()
        self.startup_s = self.process.wait_ready(self._ready, self.config.ready_timeout,
                                                 "ready (HTTP / and the zmq server)")
        return self

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
