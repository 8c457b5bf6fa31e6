"""One interface over two OpenAI-compatible replicas that share one LMCache pool.

``send("A" | "B", prompt, ...)`` returns the continuation and the request's hit counts:
``cached_tokens`` as the engine reports it in ``usage``, split into local (the engine's
own prefix cache) and external (LMCache) hit tokens from the engine's Prometheus counters,
read before and after each request (requests go one at a time, so the deltas are the
request's). Replicas are launched (``ManagedProcess``) or external (nothing is started or
stopped); ``restart`` and ``logs`` work on launched ones.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_sharedkv.processes.managed import ManagedProcess, ProcessFailed, http_ok
from pytest_sharedkv.stack.completions import read_usage, request_body
from pytest_sharedkv.stack.launch_record import LaunchRecord
from pytest_sharedkv.stack.metrics import (
    EXTERNAL_HITS,
    LOCAL_HITS,
    Counters,
    counter_delta,
    counters_read,
    parse_counters,
)

if TYPE_CHECKING:
    from pytest_sharedkv.stack.topology import Topology

UNREAD = "counters could not be read"
REPLICAS = ("A", "B")


class ReplicaError(RuntimeError):
    """A request failed; the message names the replica and, if launched, its log tail."""


@dataclass(frozen=True)
class Reply:
    replica: str
    text: str
    prompt_tokens: int
    cached_tokens: int
    local_hit_tokens: int | None
    external_hit_tokens: int | None
    seconds: float
    # False: a metrics read before or after the request failed, so the hit split is
    # unknown (local/external None), never a guess
    counters_read: bool = True


def _one_line(exc: BaseException) -> str:
    """urllib's errors wrap the socket's: '[Errno 111] Connection refused', one line."""
    reason = getattr(exc, "reason", None)
    text = str(reason if isinstance(exc, urllib.error.URLError) and reason else exc)
    return (text.strip().splitlines() or [type(exc).__name__])[0][:300]


@dataclass
class Replica:
    name: str
    base_url: str
    process: ManagedProcess | None = None
    ready_path: str = "/health"
    ready_timeout: float = 600.0
    model: str | None = None
    reports_external: bool = False  # usage.cached_tokens includes connector (LMCache) hits
    start_seconds: list[float] = field(default_factory=list)
    # why this replica can never become ready although its process lives (a peer failed)
    abort: Callable[[], str | None] | None = None
    # the engine's dialect (stack/launch/sglang_engine.py): its /metrics text read into the
    # suite's counter names, its answers' usage into vLLM's shape; None: vLLM's own
    counters_from: Callable[[str], Counters] | None = None
    answer_shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def _ready(self) -> bool:
        return http_ok(self.base_url + self.ready_path)

    def start(self) -> None:
        if self.process is None:
            raise ReplicaError(f"replica {self.name} is external: the suite does not start it")
        self.process.start()
        self.start_seconds.append(
            self.process.wait_ready(self._ready, self.ready_timeout, f"serving {self.ready_path}",
                                    abort=self.abort))

    def restart(self) -> None:
        if self.process is None:
            raise ReplicaError(f"replica {self.name} is external: the suite cannot restart it")
        leftovers = self.process.stop()
        if leftovers:
            raise ReplicaError(f"replica {self.name}: processes {leftovers} survived the stop")
        self.start()

    def stop(self) -> list[int]:
        return self.process.stop() if self.process is not None else []

    def logs(self) -> str:
        return self.process.log_text() if self.process is not None else "(external replica)"

    def _get(self, path: str) -> str:
        """GET PATH; a failure is a ReplicaError that names the replica and its URL in one
        line (not urllib's chained traceback)."""
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=30) as response:
                return str(response.read().decode())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise self._failure(f"request failed: GET {path}: {_one_line(exc)}") from None

    def counters(self) -> Counters | None:
        """The engine's Prometheus counters; None when they could not be read (an error, or
        an answer with no counters in it): unknown, not zero. A replica that is down fails
        the request that follows, which names it (and, once its process has died, says so)."""
        try:
            found = (self.counters_from or parse_counters)(self._get("/metrics"))
        except ReplicaError:
            return None
        return found or None

    def served_model(self) -> str:
        if self.model is None:
            text = self._get("/v1/models")
            try:
                self.model = str(json.loads(text)["data"][0]["id"])
            except (ValueError, LookupError, TypeError) as exc:
                raise self._failure(f"GET /v1/models: no model id in the answer "
                                    f"({_one_line(exc)}): {text[:200]!r}") from None
        return self.model

    def complete(self, prompt: str, max_tokens: int, cache_salt: str | None,
                 request_id: str | None = None) -> Reply:
        before = self.counters()
        request = self._completion_request(request_body(prompt, max_tokens, cache_salt),
                                           request_id)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                data = json.loads(response.read())
        except (urllib.error.URLError, OSError) as exc:
            raise self._failure(f"request failed: {exc}") from None
        seconds = time.perf_counter() - started
        after = self.counters()
        usage = read_usage(self._shaped(data))
        cached = usage.cached_tokens or 0
        local = counter_delta(before, after, LOCAL_HITS)
        external = counter_delta(before, after, EXTERNAL_HITS)
        if external is None and local is not None and self.reports_external:
            external = cached - local  # the engine's cached tokens count both kinds
        return Reply(replica=self.name, text=str(data["choices"][0]["text"]),
                     prompt_tokens=usage.prompt_tokens or 0, cached_tokens=cached,
                     local_hit_tokens=local, external_hit_tokens=external, seconds=seconds,
                     counters_read=counters_read(before, after))

    def _completion_request(self, body: dict[str, object], request_id: str | None = None
                            ) -> urllib.request.Request:
        payload = {"model": self.served_model(), **body}
        headers = {"Content-Type": "application/json"}
        if request_id is not None:
            headers["X-Request-Id"] = request_id  # vLLM names the engine request after it
        return urllib.request.Request(self.base_url + "/v1/completions",
                                      data=json.dumps(payload).encode(), headers=headers)

    def post(self, body: dict[str, object], timeout: float = 600.0,
             request_id: str | None = None) -> dict[str, Any]:
        """POST /v1/completions (the served model filled in); the JSON answer, or a
        ReplicaError naming the replica. Safe to call from many threads at once.
        REQUEST_ID (X-Request-Id) lets the in-engine KV audit name the request."""
        request = self._completion_request(body, request_id)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                data: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise self._failure(f"HTTP {exc.code} for /v1/completions: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise self._failure(f"request failed: {exc}") from None
        return self._shaped(data)

    def _shaped(self, data: dict[str, Any]) -> dict[str, Any]:
        """DATA (an answer or a stream event) in vLLM's shape, through the engine's
        dialect where it has one."""
        return self.answer_shape(data) if self.answer_shape is not None else data

    def stream(self, body: dict[str, object], timeout: float = 600.0
               ) -> list[dict[str, Any]]:
        """POST /v1/completions with stream=true; the server-sent events, in order."""
        request = self._completion_request({**body, "stream": True})
        events = []
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        events.append(self._shaped(json.loads(line[5:])))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise self._failure(f"streamed request failed: {exc}") from None
        return events

    def _failure(self, why: str) -> ReplicaError:
        if self.process is None:
            return ReplicaError(f"replica {self.name} ({self.base_url}): {why}")
        state = "running" if self.process.alive() else "DEAD"
        return ReplicaError(f"replica {self.name} ({state}): {why}\n--- last lines of "
                            f"{self.process.log_path} ---\n{self.process.tail()}")


class FactSink(Protocol):
    """Where a fact goes (report.records.ResultSink; stack does not import report)."""

    def fact(self, name: str, value: str) -> object: ...


class ReplicaPair:
    """Two replicas (A, B) and, when launched, the LMCache server they share; RECORD says
    what the provider launched (or, for external endpoints, what is known of them)."""

    def __init__(self, a: Replica, b: Replica, record: LaunchRecord,
                 stop_server: Callable[[], list[int]] | None = None,
                 relaunch: Callable[..., ReplicaPair] | None = None,
                 topology: Topology | None = None) -> None:
        self.replicas = {"A": a, "B": b}
        self.record = record
        # its servers as the tiers read them (logs, evictions, the L2 of the hosts
        # topology); None where the suite launched no server it can read (external)
        self.topology = topology
        self._stop_server = stop_server
        # the same pair again with LaunchSpec fields changed (the triage's cells); None
        # where the suite launched nothing (external endpoints)
        self.relaunch = relaunch
        # each launched process's start in seconds: "ready" (the suite's measure) and the
        # phases its own log names (engine_start); empty where nothing was launched
        self.starts: dict[str, dict[str, float]] = {}
        # each replica's GPU KV cache in tokens, from its engine's start log
        # (engine_start.gpu_kv_tokens); None where unknown (external, or no such line)
        self.gpu_kv_tokens: dict[str, int | None] = dict.fromkeys(REPLICAS)
        self._launches_recorded = False
        self._lock = threading.Lock()

    @property
    def description(self) -> str:
        return self.record.description

    @property
    def model(self) -> Path | None:
        """The served checkpoint, when the suite launched it."""
        return self.record.model

    @property
    def labels(self) -> dict[str, str]:
        """Provider, allocator, delay: the report's key (a fresh dict)."""
        return self.record.labels

    @property
    def delay_cycles(self) -> int:
        """Fault-sensitivity mode: the delay the launched processes got."""
        return self.record.delay_cycles

    @property
    def inject_log(self) -> Path | None:
        return self.record.paths.inject_log

    @property
    def gate_control(self) -> Path | None:
        """The service tier's sensitivity gate: the control file the server's hook reads
        (None where nothing can be injected: external endpoints)."""
        return self.record.paths.gate_control

    @property
    def gate_log(self) -> Path | None:
        return self.record.paths.gate_log

    @property
    def kv_audit_dir(self) -> Path | None:
        return self.record.paths.kv_audit_dir

    @property
    def sync_log(self) -> Path | None:
        return self.record.paths.sync_log

    @property
    def launches(self) -> list[dict[str, Any]]:
        """What the suite launched (name, argv, the env it set); empty for external
        endpoints."""
        return self.record.launches()

    @property
    def engine_settings(self) -> dict[str, Any]:
        """The engine settings its replicas ran with; {} where unknown."""
        return self.record.engine_settings()

    @property
    def devices(self) -> dict[str, tuple[str, ...]]:
        """The CUDA devices each launched engine got (its CUDA_VISIBLE_DEVICES; () where
        it inherited the run's): its placement; empty where the suite placed no engine."""
        return self.record.devices()

    def record_launches(self, sink: FactSink) -> None:
        """Put what this pair launched in the report, once per pair: a fact "launch" for
        each process (JSON: name, argv, the env the suite set), "engine_settings" (the
        tiers other than perf, whose PerfRun holds them), "stack" (a non-MP stack's) and
        "gpu_kv_tokens" (each replica's GPU KV cache in tokens, null where unknown), where
        an engine's start log named one."""
        launches, settings = self.launches, self.engine_settings
        if self._launches_recorded or not (launches or settings):
            return
        self._launches_recorded = True
        for launch in launches:
            sink.fact("launch", json.dumps(launch, sort_keys=True))
        if settings:
            sink.fact("engine_settings", json.dumps(settings, sort_keys=True))
        if self.record.stack is not None:  # the KV stack, a fact compare reads first
            sink.fact("stack", json.dumps(dict(self.record.stack), sort_keys=True))
        if any(n is not None for n in self.gpu_kv_tokens.values()):
            sink.fact("gpu_kv_tokens", json.dumps(self.gpu_kv_tokens, sort_keys=True))
        if self.record.topology != "shared" or self.topology is not None:
            sink.fact("topology", json.dumps(self.record.topology_record(), sort_keys=True))

    @property
    def has_server(self) -> bool:
        """Whether the suite launched an LMCache server for this pair."""
        return self._stop_server is not None

    def __getitem__(self, name: str) -> Replica:
        if name not in self.replicas:
            raise KeyError(f"replica must be one of {REPLICAS}, not {name!r}")
        return self.replicas[name]

    def send(self, name: str, prompt: str, max_tokens: int = 16,
             cache_salt: str | None = None, request_id: str | None = None) -> Reply:
        with self._lock:  # one request at a time: counter deltas belong to it
            return self[name].complete(prompt, max_tokens, cache_salt, request_id)

    def restart(self, name: str) -> None:
        self[name].restart()

    def logs(self, name: str) -> str:
        return self[name].logs()

    def close(self) -> list[int]:
        """Stop everything started, replicas first; returns PIDs that survived (must be none)."""
        leftovers: list[int] = []
        for replica in self.replicas.values():
            leftovers += replica.stop()
        if self._stop_server is not None:
            leftovers += self._stop_server()
        return leftovers


def start_all(pair: ReplicaPair, together: bool = False) -> None:
    """Start launched replicas: one after the other where they share a GPU (two engines
    started together on one GPU profile each other's memory and the second finds no room
    for its cache), TOGETHER where they cannot get in each other's way (each on its own
    GPU, or each with a fixed cache): an engine's start is mostly compilation, so two at
    once take about the time of one. If one fails, stop everything the pair started
    before raising."""
    launched = [r for r in pair.replicas.values() if r.process is not None]
    try:
        if together and len(launched) > 1:
            from pytest_sharedkv.processes.thread_pool import thread_pool

            with thread_pool(len(launched)) as pool:
                for future in [pool.submit(r.start) for r in launched]:
                    future.result()
        else:
            for replica in launched:
                replica.start()
    except ProcessFailed as exc:
        pair.close()
        raise ReplicaError(str(exc)) from None
    except BaseException:
        pair.close()
        raise
