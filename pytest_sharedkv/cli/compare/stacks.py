"""A stack change: BEFORE's replicas shared KV through one integration and AFTER's through
another (LMCache's MP server -> its in-process connector, LMCache -> vLLM's own CPU
offload), or through another connector of one (vLLM's ``OffloadingConnector`` ->
``SimpleCPUOffloadConnector``, ``--sharedkv-native-connector``). The tests and records are
the same on both sides, so they are compared test for test; the line says that a
difference between them is the stack's, not an upgrade's.

Read from what the report recorded: a "stack" fact (the launch configuration's record:
connector and backend), else the argv and environment of the processes it launched (the
"launch" facts, the perf screening's ``perf.launches``), and LMCache's version from the
environment. A report that recorded no launch is unknown, never taken for today's MP
server, and unknown is never called a change."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pytest_sharedkv.cli.compare.reading import Report, environment_of

STACK_CHANGE = "STACK CHANGE"
MP = "LMCache MP server"
INPROCESS = "LMCache in-process"
NATIVE = "vLLM native offload"
NONE = "no connector"
STUB = "stub (test double)"
# vLLM 0.26's connector names -> the integration they run
KINDS = {"LMCacheMPConnector": MP, "LMCacheConnectorV1": INPROCESS,
         "OffloadingConnector": NATIVE, "SimpleCPUOffloadConnector": NATIVE}
LMCACHE_KINDS = frozenset({MP, INPROCESS})
SIMPLE_ENV = "VLLM_USE_SIMPLE_KV_OFFLOAD"
REMOTE_ENV = "LMCACHE_REMOTE_URL"  # the in-process connector's remote, as LMCache reads it
HEADER_VERSION = re.compile(r"\blmcache (\S+?);")


@dataclass(frozen=True)
class Connector:
    """One replica's way of sharing KV: the connector vLLM ran and its backend, where the
    report says it (None: not recorded)."""

    name: str | None  # the vLLM connector class; None: no connector
    backend: str | None = None

    @property
    def kind(self) -> str:
        if self.name is None:
            return NONE
        return KINDS.get(self.name, self.name)

    def describe(self, lmcache: str | None = None) -> str:
        """In words, with LMCACHE (its version) where an LMCache connector runs."""
        if self.name is None:
            return NONE
        version = (f"LMCache {lmcache or 'version unknown'}"
                   if self.kind in LMCACHE_KINDS else None)
        return f"{self.kind} ({', '.join(x for x in (self.name, self.backend, version) if x)})"


@dataclass(frozen=True)
class Stack:
    """What a report's replicas ran: every connector its launches used (a perf screening
    runs several arms) and LMCache's version where an LMCache connector was among them."""

    connectors: frozenset[Connector]
    lmcache: str | None

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(c.kind for c in self.connectors)

    def describe(self) -> str:
        return " + ".join(sorted(c.describe(self.lmcache) for c in self.connectors))


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def connector_of(argv: list[str], env: Mapping[str, str]) -> Connector | None:
    """The connector a ``vllm serve`` command line runs, None where ARGV is no vLLM."""
    if "serve" not in argv:
        return None
    name: str | None = None
    backend: str | None = None
    raw = _option(argv, "--kv-transfer-config")
    if raw is not None:
        try:
            config = json.loads(raw)
        except (ValueError, RecursionError):  # a string nested too deeply
            config = {}
        if isinstance(config, dict) and isinstance(config.get("kv_connector"), str):
            name = config["kv_connector"]
    offload = _option(argv, "--kv-offloading-backend")
    if _option(argv, "--kv-offloading-size") is not None:
        if offload in (None, "native"):  # vLLM 0.26's default backend is native
            simple = str(env.get(SIMPLE_ENV, "")).lower() in ("1", "true")
            name = "SimpleCPUOffloadConnector" if simple else "OffloadingConnector"
            backend = "CPU"
        elif offload == "lmcache":
            name = "LMCacheMPConnector"
    if name == "LMCacheConnectorV1" and env.get(REMOTE_ENV):  # the remote it shares through
        backend = urlsplit(str(env[REMOTE_ENV])).scheme + "://"
    elif name == "LMCacheConnectorV1" and "LMCACHE_CONFIG_FILE" not in env:
        backend = "LMCache's defaults"
    return Connector(name, backend)


def _launches(report: Report) -> Iterable[tuple[list[str], dict[str, str]]]:
    """(argv, env) of every process the report says the suite launched."""
    for fact in report.data.get("facts", []):
        if isinstance(fact, dict) and fact.get("name") == "launch":
            try:
                value = json.loads(str(fact.get("value")))
            except (ValueError, RecursionError):  # a string nested too deeply
                continue
            if isinstance(value, dict):
                yield list(map(str, value.get("argv", []))), dict(value.get("env", {}))
    perf = report.data.get("perf")
    for block in perf.get("launches", []) if isinstance(perf, dict) else []:
        for process in block.get("processes", []) if isinstance(block, dict) else []:
            if isinstance(process, dict):
                yield (list(map(str, process.get("argv", []))),
                       dict(process.get("env", {})))


def _stack_facts(report: Report) -> list[dict[str, Any]]:
    found = []
    for fact in report.data.get("facts", []):
        if isinstance(fact, dict) and fact.get("name") == "stack":
            try:
                value = json.loads(str(fact.get("value")))
            except (ValueError, RecursionError):  # a string nested too deeply
                continue
            if isinstance(value, dict):
                found.append(value)
    return found


def lmcache_version(report: Report) -> str | None:
    """LMCache's version as the report's environment states it, else its header line."""
    section = environment_of(report, "lmcache")
    if isinstance(section, dict) and section.get("version"):
        return str(section["version"])
    for line in environment_of(report, "header") or []:
        match = HEADER_VERSION.search(str(line))
        if match:
            return match.group(1)
    return None


def l2_backend(argv: list[str]) -> str | None:
    """The L2 an LMCache MP server command line names (``--l2-adapter`` JSON: its
    types), None where ARGV is no such server; "L1 only" where it names none."""
    if not any("lmcache" in a for a in argv) or "server" not in argv:
        return None
    types = []
    for i, arg in enumerate(argv[:-1]):
        if arg == "--l2-adapter":
            try:
                spec = json.loads(argv[i + 1])
            except (ValueError, RecursionError):  # a string nested too deeply
                spec = {}
            types.append(str(spec.get("type", "?")) if isinstance(spec, dict) else "?")
    return f"L2 {'+'.join(sorted(types))}" if types else "L1 only"


def stack_of(report: Report) -> Stack | None:
    """The stack REPORT ran; None where it recorded no launch of an engine (an older
    report, external endpoints): unknown."""
    connectors: set[Connector] = set()
    for value in _stack_facts(report):
        name = value.get("connector")
        backend = value.get("backend")
        connectors.add(Connector(str(name) if name else None,
                                 str(backend) if backend else None))
    if not connectors:
        stub = False
        servers = set()
        for argv, env in _launches(report):
            found = connector_of(argv, env)
            server = l2_backend(argv)
            if found is not None:
                connectors.add(found)
            elif server is not None:
                servers.add(server)
            elif any("stub_openai" in a for a in argv):
                stub = True
        if len(servers) == 1:  # the MP server the replicas talked to
            connectors = {Connector(c.name, next(iter(servers))) if c.kind == MP else c
                          for c in connectors}
        if not connectors and stub:
            connectors.add(Connector(STUB))
    if not connectors:
        return None
    return Stack(frozenset(connectors), lmcache_version(report))


def stack_change(before: Report, after: Report) -> tuple[Stack, Stack] | None:
    """(BEFORE's stack, AFTER's) where both are known and their connectors or backends
    differ; None otherwise. LMCache's version alone is no stack change: that is the
    upgrade ``compare`` is for."""
    b, a = stack_of(before), stack_of(after)
    if b is None or a is None or _compared(b) == _compared(a):
        return None
    return b, a


def _compared(stack: Stack) -> frozenset[tuple[str | None, str | None]]:
    """What a stack change compares: each connector and its backend, but not the MP
    server's L1/L2, which only the hosts topology changes and TOPOLOGY DIFFERS names."""
    return frozenset((c.name, None if c.kind == MP else c.backend) for c in stack.connectors)


def change_line(found: tuple[Stack, Stack]) -> str:
    before, after = found
    return (f"{STACK_CHANGE}: BEFORE ran {before.describe()}, AFTER {after.describe()}: "
            "the same tests are compared on two stacks, so a difference is the stack's, "
            "not an upgrade's")
