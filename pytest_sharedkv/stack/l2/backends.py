"""The L2 that LMCache servers on different hosts share, as one typed choice: a real Redis
the suite starts (``resp`` or ``valkey`` adapter), a shared directory (``fs`` or
``fs_native``: needs nothing beyond LMCache), or an existing L2 the user names (nothing
started or stopped).

Each gives the ``--l2-adapter`` JSON for ``lmcache server``, counts what it holds (a count
that could not be read is None, never 0), lists the entries of one cache salt (LMCache
0.5.6 ends every key with ``@<cache_salt>``: ``fs_l2_adapter.py:108``, the RESP keys
likewise), flips a byte of one for the planted-fault control, and says what is wrong with
it as an :class:`L2Problem` (data: phase B turns it into a usage error naming the option).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_sharedkv.processes.managed import ProcessFailed
from pytest_sharedkv.report.records import Problem
from pytest_sharedkv.stack.l2 import redis_server

ProblemKind = Literal["bad-spec", "redis-missing", "client-missing", "port-in-use",
                      "start-failed", "unreachable", "not-writable", "adapter-missing",
                      "mount-refused"]
REDIS_TYPES = ("resp", "valkey")
PORT_TRIES = 3  # free ports the suite's Redis tries, each taken before it listened
DIRECTORY_TYPES = ("fs", "fs_native")
SUITE_TYPES = REDIS_TYPES + DIRECTORY_TYPES  # what the suite can provide itself
FILE_SUFFIX = ".data"  # fs_l2_adapter.py:57; fs_native writes the same names
# What an adapter type needs beyond LMCache's Python: (module, where it comes from). The
# compiled ones are LMCache's own extensions, looked for beside its package.
NEEDS: dict[str, tuple[str, str]] = {
    "resp": ("lmcache.lmcache_redis", "LMCache's compiled lmcache_redis extension"),
    "fs_native": ("lmcache.lmcache_fs", "LMCache's compiled lmcache_fs extension"),
    "valkey": ("glide_sync", "PyPI valkey-glide-sync"),
}
REGISTERED = re.compile(r"register_l2_adapter_type\(\s*[\"']([^\"']+)[\"']")


class L2Problem(Problem):
    """What keeps an L2 from serving: one of the suite's problems (``report.records``), its
    kind one of ``ProblemKind``, its text one line naming the culprit."""

    kind: ProblemKind

    def __new__(cls, kind: ProblemKind, message: str) -> L2Problem:
        return super().__new__(cls, message, kind)


class L2Unavailable(RuntimeError):
    def __init__(self, problem: L2Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def _lmcache_dir() -> Path | None:
    spec = importlib.util.find_spec("lmcache")  # top-level: found, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def adapter_types(lmcache: Path | None = None) -> set[str]:
    """The L2 adapter types the installed LMCache registers, read from its source (importing
    its adapters package pulls in torch and every adapter's client)."""
    lmcache = lmcache or _lmcache_dir()
    if lmcache is None:
        return set()
    folder = lmcache / "v1" / "distributed" / "l2_adapters"
    return {name for path in folder.glob("*.py")
            for name in REGISTERED.findall(path.read_text(errors="replace"))}


def _module_present(module: str, lmcache: Path | None) -> bool:
    package, _, name = module.partition(".")
    if package == "lmcache":
        return lmcache is not None and any(lmcache.glob(f"{name}.*.so"))
    return importlib.util.find_spec(module) is not None


def adapter_problem(adapter_type: str, lmcache: Path | None = None) -> L2Problem | None:
    """None when the installed LMCache has ADAPTER_TYPE and what it needs; else why not."""
    lmcache = lmcache or _lmcache_dir()
    if lmcache is None:
        return L2Problem("adapter-missing", "LMCache is not installed: no L2 adapter at all")
    types = adapter_types(lmcache)
    if adapter_type not in types:
        return L2Problem("adapter-missing",
                         f"the installed LMCache has no L2 adapter type {adapter_type!r} "
                         f"(it has {', '.join(sorted(types)) or 'none'})")
    module, source = NEEDS.get(adapter_type, ("", ""))
    if module and not _module_present(module, lmcache):
        return L2Problem("adapter-missing",
                         f"LMCache's {adapter_type!r} L2 adapter needs {source} (module "
                         f"{module}), which is not installed")
    return None


class L2:
    """One L2 as LMCache servers see it (subclasses: where its entries live)."""

    adapter_type: str = ""

    def adapter(self) -> dict[str, Any]:
        raise NotImplementedError

    def adapter_json(self) -> str:
        return json.dumps(self.adapter(), sort_keys=True)

    def describe(self) -> str:
        return self.adapter_json()

    def start(self) -> None:
        """Make it ready to serve (what the suite owns) or check it (what it was given);
        raises L2Unavailable naming what is wrong."""
        problem = self.problem()
        if problem is not None:
            raise L2Unavailable(problem)

    def stop(self) -> list[int]:
        return []

    def problem(self) -> L2Problem | None:
        return adapter_problem(self.adapter_type)

    def count(self) -> int | None:
        """How many entries it holds; None when that cannot be read."""
        return None

    def entries(self, salt: str) -> list[str] | None:
        """The entries of one cache salt; None when they cannot be listed."""
        return None

    def corrupt(self, entry: str) -> str:
        """Flip one byte of ENTRY in place; says which byte."""
        raise NotImplementedError(f"cannot plant a byte in a {self.adapter_type} L2")

    def read(self, entry: str) -> bytes | None:
        """ENTRY's bytes; None where it is absent or cannot be read."""
        return None

    def write(self, entry: str, data: bytes) -> None:
        """Store DATA as ENTRY, whole or not at all (the stub double stores through it);
        raises OSError or the client's error where the L2 refuses it."""
        raise NotImplementedError(f"cannot write into a {self.adapter_type} L2")

    def remove(self, entry: str) -> None:
        """Remove ENTRY where it is (the suite's own probe entries); nothing where absent."""
        raise NotImplementedError(f"cannot remove from a {self.adapter_type} L2")

    def held(self, salt: str) -> Held | None:
        """What it holds of SALT, chunk by chunk; None when that cannot be listed."""
        found = self.entries(salt)
        return None if found is None else held_of(found)


class RedisL2(L2):
    """A Redis (or Valkey) server, through LMCache's ``resp`` or ``valkey`` adapter; owns the
    RedisServer it was given, if any (started at start, stopped at stop)."""

    def __init__(self, host: str, port: int, adapter_type: str = "resp",
                 server: redis_server.RedisServer | None = None) -> None:
        if adapter_type not in REDIS_TYPES:
            raise ValueError(f"a Redis L2 is one of {REDIS_TYPES}, not {adapter_type!r}")
        self.host, self.port, self.adapter_type, self.server = host, port, adapter_type, server

    def adapter(self) -> dict[str, Any]:
        if self.adapter_type == "valkey":
            return {"type": "valkey", "startup_nodes": f"{self.host}:{self.port}"}
        return {"type": "resp", "host": self.host, "port": self.port}

    def describe(self) -> str:
        owner = f"redis-server ({self.server.binary.source})" if self.server else "Redis"
        return f"{self.adapter_type} -> {owner} at {self.host}:{self.port}"

    def start(self) -> None:
        """Started and answering; a port the suite picked that another process took before
        the Redis listened there is replaced by another, PORT_TRIES in all."""
        missing = adapter_problem(self.adapter_type)
        if missing is not None:
            raise L2Unavailable(missing)
        tried: list[int] = []
        while True:
            try:
                self._start_server()
                break
            except L2Unavailable as exc:
                tried.append(self.port)
                if exc.problem.kind != "port-in-use" or self.server is None \
                        or not self.server.chosen:
                    raise
                if len(tried) >= PORT_TRIES:
                    raise L2Unavailable(L2Problem("port-in-use", (
                        f"{exc.problem.message} (the suite picked {len(tried)} free ports, "
                        f"{', '.join(map(str, tried))}, and each was taken before its Redis "
                        "listened there)"))) from None
                self.port = self.server.repick()
        super().start()

    def _start_server(self) -> None:
        if self.server is not None:
            if redis_server.port_in_use(self.port, self.host):
                raise L2Unavailable(L2Problem(
                    "port-in-use", f"port {self.port} on {self.host} is in use: the suite's "
                    "Redis cannot listen there"))
            try:
                self.server.start()
            except ProcessFailed as exc:
                self.server.stop()
                kind: ProblemKind = "port-in-use" if self.server.port_taken(exc) else "start-failed"
                raise L2Unavailable(L2Problem(kind, f"{self.server.process.name} did not start: "
                                              f"{str(exc).splitlines()[0]}")) from None

    def stop(self) -> list[int]:
        return self.server.stop() if self.server is not None else []

    def problem(self) -> L2Problem | None:
        missing = adapter_problem(self.adapter_type)
        if missing is not None:
            return missing
        why = redis_server.ping(self.host, self.port)
        if why is not None:
            return L2Problem("unreachable", f"no Redis answers at {self.host}:{self.port} "
                             f"({why})")
        return None

    def count(self) -> int | None:
        import redis

        try:
            with redis_server.client(self.host, self.port) as conn:
                return int(conn.dbsize())
        except (redis.RedisError, OSError):
            return None

    def entries(self, salt: str) -> list[str] | None:
        import redis

        try:
            with redis_server.client(self.host, self.port) as conn:
                return sorted(key.decode(errors="replace")
                              for key in conn.scan_iter(match=f"*@{salt}", count=1000))
        except (redis.RedisError, OSError):
            return None

    def corrupt(self, entry: str) -> str:
        with redis_server.client(self.host, self.port) as conn:
            size = int(conn.strlen(entry))
            if size == 0:
                raise ValueError(f"Redis key {entry} is empty")
            at = size // 2
            old = bytes(conn.getrange(entry, at, at))
            conn.setrange(entry, at, bytes([old[0] ^ 0xFF]))
        return f"Redis key {entry}, byte {at} of {size} (SETRANGE)"

    def read(self, entry: str) -> bytes | None:
        import redis

        try:
            with redis_server.client(self.host, self.port) as conn:
                value = conn.get(entry)
        except (redis.RedisError, OSError):
            return None
        return bytes(value) if value is not None else None

    def write(self, entry: str, data: bytes) -> None:
        with redis_server.client(self.host, self.port) as conn:
            conn.set(entry, data)

    def remove(self, entry: str) -> None:
        with redis_server.client(self.host, self.port) as conn:
            conn.delete(entry)


class DirectoryL2(L2):
    """A directory every server reaches (a shared filesystem across hosts), through LMCache's
    ``fs`` (Python) or ``fs_native`` (C++) adapter; each entry a ``.data`` file written under
    a temporary name and renamed, so a file that is there is whole."""

    def __init__(self, path: Path, adapter_type: str = "fs", create: bool = True) -> None:
        if adapter_type not in DIRECTORY_TYPES:
            raise ValueError(f"a directory L2 is one of {DIRECTORY_TYPES}, not {adapter_type!r}")
        self.path, self.adapter_type, self.create = path, adapter_type, create

    def adapter(self) -> dict[str, Any]:
        return {"type": self.adapter_type, "base_path": str(self.path)}

    def describe(self) -> str:
        return f"{self.adapter_type} -> {self.path}"

    def start(self) -> None:
        problem = self.problem()
        if problem is None and self.create:
            self.path.mkdir(parents=True, exist_ok=True)
        super().start()

    def problem(self) -> L2Problem | None:
        missing = adapter_problem(self.adapter_type)
        if missing is not None:
            return missing
        return directory_problem(self.path, may_create=self.create)

    def count(self) -> int | None:
        try:
            return sum(1 for _ in self.path.glob(f"*{FILE_SUFFIX}"))
        except OSError:
            return None

    def entries(self, salt: str) -> list[str] | None:
        try:
            return sorted(p.name for p in self.path.glob(f"*@{salt}{FILE_SUFFIX}"))
        except OSError:
            return None

    def corrupt(self, entry: str) -> str:
        path = self.path / entry
        size = path.stat().st_size
        if size == 0:
            raise ValueError(f"{path} is empty")
        at = size // 2
        with path.open("r+b") as file:
            file.seek(at)
            old = file.read(1)
            file.seek(at)
            file.write(bytes([old[0] ^ 0xFF]))
        return f"file {path}, byte {at} of {size}"

    def read(self, entry: str) -> bytes | None:
        try:
            return (self.path / entry).read_bytes()
        except OSError:
            return None

    def write(self, entry: str, data: bytes) -> None:
        """As LMCache's fs adapter writes: a temporary name, then one rename."""
        partial = self.path / (entry + ".tmp")
        partial.write_bytes(data)
        partial.replace(self.path / entry)

    def remove(self, entry: str) -> None:
        (self.path / entry).unlink(missing_ok=True)


class OtherL2(L2):
    """A user's adapter of a type the suite cannot look into (mooncake_store, s3, p2p, ...):
    passed to LMCache as given; its contents are unknown to the suite."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.adapter_type = str(spec.get("type", ""))

    def adapter(self) -> dict[str, Any]:
        return dict(self.spec)


def directory_problem(path: Path, may_create: bool = True) -> L2Problem | None:
    """None when LMCache can keep files in PATH (or create it there)."""
    probe = path
    while not probe.exists():
        if not may_create:
            return L2Problem("not-writable", f"L2 directory {path} does not exist")
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return L2Problem("not-writable", f"L2 directory {path}: {probe} is not a directory")
    # a file made and removed there: permission bits do not tell (root passes os.access on
    # a read-only /sys/kernel, and LMCache's first store would fail a test later)
    try:
        fd, made = tempfile.mkstemp(prefix=".sharedkv-l2-probe.", dir=probe)
    except OSError as exc:
        return L2Problem("not-writable", f"L2 directory {path}: no file can be made in "
                         f"{probe} ({exc.strerror or exc})")
    os.close(fd)
    os.unlink(made)
    return None


def redis_problem(binary: bool = True) -> L2Problem | None:
    """What keeps the suite from talking to a Redis, as data: no redis-server where it
    starts one (BINARY: whether one was found), else no Python client (redis-py)."""
    if not binary:
        return L2Problem("redis-missing", redis_server.MISSING)
    why = redis_server.client_missing()
    return None if why is None else L2Problem("client-missing", why)


def suite_redis(log_dir: Path, adapter_type: str = "resp", port: int | None = None,
                maxmemory: int | None = None,
                binary: redis_server.RedisBinary | None = None) -> RedisL2:
    """A Redis the suite starts (at start) and stops; L2Unavailable names a missing binary
    or a missing Python client (redis_problem)."""
    binary = binary or redis_server.find_redis_server()
    problem = redis_problem(binary is not None)
    if problem is not None:
        raise L2Unavailable(problem)
    assert binary is not None
    server = redis_server.RedisServer(binary, log_dir, port=port, maxmemory=maxmemory)
    return RedisL2(redis_server.HOST, server.port, adapter_type, server=server)


# The fields of an adapter JSON this suite reads, with their JSON types, per adapter type.
SPEC_FIELDS: dict[str, dict[str, tuple[type, str]]] = {
    "resp": {"host": (str, "a string"), "port": (int, "an integer")},
    "valkey": {"startup_nodes": (str, "a string (host:port,...)")},
    **{t: {"base_path": (str, "a string (a directory)")} for t in DIRECTORY_TYPES},
}


def spec_problem(spec: dict[str, Any]) -> L2Problem | None:
    """A field of an adapter JSON of a type this suite reaches that is missing or not of
    its JSON type, named with the type it takes (``"port": "6379"``)."""
    kind = spec.get("type")
    if kind == "fault_inject" and isinstance(spec.get("inner"), dict):
        return spec_problem(spec["inner"])
    for field, (expected, words) in SPEC_FIELDS.get(str(kind), {}).items():
        value = spec.get(field)
        if not isinstance(value, expected) or isinstance(value, bool):
            found = "missing" if field not in spec else f"{type(value).__name__} {value!r}"
            return L2Problem("bad-spec", f"L2 adapter of type {kind!r}: field {field!r} "
                             f"must be {words}, found {found}")
    return None


def existing(spec: dict[str, Any]) -> L2:
    """An L2 the user names by its adapter JSON: nothing is started, stopped or created."""
    kind = spec.get("type")
    if kind == "resp" and isinstance(spec.get("host"), str) and isinstance(spec.get("port"), int):
        return RedisL2(spec["host"], spec["port"], "resp")
    if kind == "valkey" and isinstance(spec.get("startup_nodes"), str):
        host, _, port = spec["startup_nodes"].split(",")[0].strip().rpartition(":")
        if host and port.isdigit():
            return RedisL2(host, int(port), "valkey")
    if kind in DIRECTORY_TYPES and isinstance(spec.get("base_path"), str):
        return DirectoryL2(Path(spec["base_path"]), str(kind), create=False)
    return OtherL2(spec)


def choose(value: str, work_dir: Path) -> L2:
    """The L2 a choice names: ``resp`` or ``valkey`` (a Redis the suite starts), ``fs`` or
    ``fs_native`` (a directory under WORK_DIR), or an existing L2's ``--l2-adapter`` JSON
    object; L2Unavailable names a value that is none of these."""
    if value in REDIS_TYPES:
        return suite_redis(work_dir, value)
    if value in DIRECTORY_TYPES:
        return DirectoryL2(work_dir / f"l2-{value}", value)
    if value.lstrip().startswith("{"):
        try:
            spec = json.loads(value)
        except ValueError as exc:
            raise L2Unavailable(L2Problem("bad-spec", f"L2 adapter {value!r} is not JSON: "
                                          f"{exc}")) from None
        if isinstance(spec, dict) and isinstance(spec.get("type"), str):
            return existing(spec)
        raise L2Unavailable(L2Problem("bad-spec", f"L2 adapter {value!r} has no \"type\""))
    raise L2Unavailable(L2Problem("bad-spec", f"L2 {value!r} is none of "
                                  f"{', '.join(SUITE_TYPES)} or an --l2-adapter JSON object"))


def fault_inject(inner: L2, gap_indices: tuple[int, ...]) -> dict[str, Any]:
    """LMCache's ``fault_inject`` adapter over INNER: the keys at GAP_INDICES of a load are
    reported present at lookup but fail to load (fault_inject_l2_adapter.py)."""
    return {"type": "fault_inject", "inner": inner.adapter(), "gap_indices": list(gap_indices)}


def first_gap(spec: dict[str, Any]) -> int | None:
    """The first gap index of a fault_inject adapter spec, or None."""
    if spec.get("type") != "fault_inject":
        return None
    gaps = [g for g in spec.get("gap_indices", ()) if isinstance(g, int)]
    return min(gaps) if gaps else None


@dataclass(frozen=True)
class Held:
    """One salt's entries as chunks: LMCache names each ``model@kv_rank@object_group@
    chunk_hash@salt`` (fs_l2_adapter.py:99, native_connector_l2_adapter.py:74), one entry a
    chunk per (kv rank, object group). A chunk is whole once it has every (rank, group) the
    salt's entries show."""

    entries: int
    chunks: int  # distinct chunk hashes
    whole: int  # chunks that hold every (rank, group) seen
    parts: int  # (rank, group) pairs seen

    def describe(self) -> str:
        return (f"{self.whole} whole chunk(s) of {self.chunks} seen ({self.entries} entries, "
                f"{self.parts} per chunk)")


def entry_fields(entry: str) -> tuple[str, str, str] | None:
    """(kv rank, object group, chunk hash) of an LMCache L2 entry name; None for a name of
    another form."""
    parts = entry.removesuffix(FILE_SUFFIX).split("@")
    if len(parts) < 4:
        return None
    return parts[1], parts[2], parts[3]


def held_of(entries: list[str]) -> Held:
    chunks: dict[str, set[tuple[str, str]]] = {}
    for entry in entries:
        fields = entry_fields(entry)
        if fields is not None:
            chunks.setdefault(fields[2], set()).add((fields[0], fields[1]))
    parts = set().union(*chunks.values()) if chunks else set()
    return Held(len(entries), len(chunks), sum(len(p) == len(parts) for p in chunks.values()),
                len(parts))


def configure_problem(value: str, stub: bool = False) -> L2Problem | None:
    """What keeps VALUE (a suite type or an adapter JSON object, already parsed) from
    serving, as far as it can be known before any test: no Redis binary for the suite's
    Redis, no Python client (redis-py) for any Redis, the suite's or an existing one, an
    adapter type the installed LMCache lacks (or its client), an existing L2 that does not
    answer or a directory that cannot hold files; the stub double reaches only a directory
    or a Redis. A port taken when the suite's Redis starts is said then."""
    if value in REDIS_TYPES:
        problem = redis_problem(redis_server.find_redis_server() is not None)
        if problem is not None:
            return problem
    backend: L2 | None = None
    adapter_type = value
    if value not in SUITE_TYPES:
        try:
            spec = json.loads(value)
        except ValueError as exc:
            return L2Problem("bad-spec", f"L2 adapter {value!r} is not JSON: {exc}")
        if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
            return L2Problem("bad-spec", f"L2 adapter {value!r} has no \"type\"")
        wrong = spec_problem(spec)
        if wrong is not None:
            return wrong
        backend = existing(spec)
        adapter_type = backend.adapter_type
    if _lmcache_dir() is not None:  # the servers need it (the stub alone does not)
        missing = adapter_problem(adapter_type)
        if missing is not None:
            return missing
    if stub and (isinstance(backend, OtherL2) or adapter_type not in SUITE_TYPES):
        return L2Problem("bad-spec", f"the stub provider shares KV through a directory or a "
                         f"Redis, not a {adapter_type!r} L2")
    if isinstance(backend, RedisL2):
        problem = redis_problem()  # an existing Redis: no binary, but the client pings it
        if problem is not None:
            return problem
        why = redis_server.ping(backend.host, backend.port)
        if why is not None:
            return L2Problem("unreachable", f"no Redis answers at {backend.host}:"
                             f"{backend.port} ({why})")
    if isinstance(backend, DirectoryL2):
        return directory_problem(backend.path, may_create=False)
    return None


def parse_adapter(spec: dict[str, Any]) -> tuple[L2, tuple[int, ...]]:
    """The L2 an adapter JSON object reaches and the gap indices of a fault_inject wrapper
    around it (() where none): what the stub double takes for LMCache's --l2-adapter."""
    if spec.get("type") == "fault_inject" and isinstance(spec.get("inner"), dict):
        inner, gaps = parse_adapter(spec["inner"])
        return inner, (*gaps, *(g for g in spec.get("gap_indices", ()) if isinstance(g, int)))
    return existing(spec), ()
