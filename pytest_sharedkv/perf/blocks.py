"""The perf screening: blocks of one arm each (OFF-ON-ON-OFF by default), every block the
same payloads in a fresh cache namespace, so block pairs compare like with like.

Each block (re)starts the replica pair in its arm (the restart's wall time is recorded),
sends warm-ups (recorded, flagged: each warm-up payload on A and on B, then one burst as
wide as the widest window), then per size the four steps in order: cold on A,
local on A, ONE settle (LMCache stores asynchronously; a settle per size, not per
request), cross on B, receiver-local on B; a size whose requests the pool cannot hold
together goes through the four steps one request at a time. Requests go one at a time,
so each TTFT is a request's own. Then six-turn sessions, two at once, all turns on A
(fixed) or alternating A, B, A, ... (a settle before each turn that changes replica; a
session's wall time is the sum of its turns, settles aside), and short windows of 4 and
8 alternating sessions at once (throughput screening; those sessions are named ``w<N>/...``).

External endpoints cannot be restarted into arms: they give one block, as deployed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_sharedkv.corpus.cases import prompt_size
from pytest_sharedkv.perf.hits import not_from_l2
from pytest_sharedkv.perf.observations import (
    PERF_SCHEMA,
    Floor,
    Observation,
    PerfRun,
    ReplicaPlacement,
    SessionObservation,
    describe_placement,
    placed_on,
)
from pytest_sharedkv.perf.pairing import CONTROL, pair_layout
from pytest_sharedkv.perf.payloads import Payload, PayloadSet, SessionPayload
from pytest_sharedkv.perf.timing import Timing, observation, stream_timing
from pytest_sharedkv.processes.thread_pool import map_concurrently, thread_pool
from pytest_sharedkv.stack.completions import request_body
from pytest_sharedkv.stack.launch.engine_start import describe
from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
from pytest_sharedkv.stack.offload_traffic import logged_traffic
from pytest_sharedkv.stack.pair import ReplicaError, ReplicaPair
from pytest_sharedkv.stack.request_tags import request_tag
from pytest_sharedkv.stack.steps import STEP_NAMES, STEPS, Step

Launch = Callable[[str], ReplicaPair]  # arm -> a started pair in that arm
Salts = Callable[[str], str]  # namespace key -> a fresh cache_salt
PLACEMENTS = {"fixed": "AAAAAA", "alternating": "ABABAB"}


def placement_note(placement: ReplicaPlacement) -> str:
    """The report's line on where the replicas ran, with each one's devices."""
    words = describe_placement(placement.pair_gpus)
    where = {name: f"CUDA device {d}" if d else "the run's devices"
             for name, d in placement.replicas.items()}
    if not where:
        return f"replica placement: {words}"
    if len(set(where.values())) == 1:
        return f"replica placement: {words} ({next(iter(where.values()))})"
    return f"replica placement: {words} (" + ", ".join(
        f"{name} on {d}" for name, d in where.items()) + ")"


def block_arms(pairs: int, treatments: Sequence[str] = ("ON",)) -> tuple[str, ...]:
    """N block pairs of OFF and the TREATMENTS, alternating direction so drift cancels:
    2 pairs of ON -> OFF ON ON OFF; of NATIVE (vLLM's own CPU offloading) -> OFF NATIVE
    NATIVE OFF; of ON and NATIVE -> OFF ON NATIVE NATIVE ON OFF."""
    if pairs < 1:
        raise ValueError(f"block pairs must be at least 1, not {pairs}")
    if not treatments or CONTROL in treatments or len(set(treatments)) != len(treatments):
        raise ValueError(f"treatment arms must be distinct arms besides {CONTROL}, not "
                         f"{list(treatments)}")
    group = [CONTROL, *treatments]
    arms: list[str] = []
    for p in range(pairs):
        arms += group if p % 2 == 0 else group[::-1]
    return tuple(arms)


@dataclass(frozen=True)
class Plan:
    arms: tuple[str, ...]
    provider: str = ""  # vllm (launched on a GPU), stub (the test double), external
    max_tokens: int = 32
    settle_s: float = 0.5  # plus store_s_per_token for every prompt token A answered
    store_s_per_token: float = STORE_S_PER_TOKEN
    sessions_per_placement: int = 2
    windows: tuple[int, ...] = (4, 8)
    restartable: bool = True  # False: external endpoints, one block as deployed
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"ignore_eos": True}
    timeout_s: float = 600.0
    # sizes whose requests run their four steps one request at a time: the pool holds one
    # of them, not all (pool_size.PoolSize.one_by_one)
    one_by_one: frozenset[str] = frozenset()


@dataclass
class Accounting:
    """Where the screening's time went: the tier's own overhead is wall / busy."""

    busy_s: float = 0.0  # request latencies (a window's turn: its wall) and restarts
    settle_s: float = 0.0
    cached: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # share cached
    windows: dict[tuple[int, str], list[float]] = field(default_factory=dict)  # wall per block

    def hit(self, arm: str, step: str, timing: Timing) -> None:
        if timing.cached_tokens is not None and timing.prompt_tokens:
            self.cached.setdefault((arm, step), []).append(
                timing.cached_tokens / timing.prompt_tokens)


class BlockRunner:
    def __init__(self, launch: Launch, payloads: PayloadSet, plan: Plan, salts: Salts, *,
                 model_digest: str, engine: dict[str, str], floor: Floor | None = None,
                 notes: Sequence[str] = (), log: Callable[[str], None] | None = None,
                 chunk_tokens: int | None = None) -> None:
        self.launch = launch
        self.payloads = payloads
        self.plan = plan
        self.salts = salts
        self.log = log or (lambda line: None)
        self.pair: ReplicaPair | None = None
        self._salts: dict[str, str] = {}
        self.accounting = Accounting()
        self.refusals: list[str] = []
        self.where = "the first start"  # the phase running now, for progress and failures
        self.pairs = pair_layout(plan.arms)  # each block's pair: OFF and one of each treatment
        self.run_record = PerfRun(schema=PERF_SCHEMA, model_digest=model_digest,
                                  corpus_digest=payloads.digest, engine=dict(engine),
                                  blocks=list(plan.arms), floor=floor, notes=list(notes),
                                  chunk_tokens=chunk_tokens, block_pairs=list(self.pairs))

    # -- the screening ---------------------------------------------------------------

    def run(self) -> PerfRun:
        record = self.run_record
        started = time.perf_counter()
        try:
            self._blocks()
        except BaseException as exc:  # the observations so far stay in run_record
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            record.notes.append(f"INCOMPLETE: the screening stopped in {self.where} after "
                                f"{time.perf_counter() - started:.1f} s: {first[:300]}")
            raise
        finally:
            record.wall_s = time.perf_counter() - started
            self._close()
        self.refusals += check_tokens(record.observations, self.payloads)
        self.refusals += not_from_l2(record.observations)
        record.notes += [*self._hit_notes(), *self._window_notes()]
        return record

    def _blocks(self) -> None:
        for block, arm in enumerate(self.plan.arms):
            self._block(block, arm)

    def _phase(self, block: int, arm: str, what: str) -> Callable[[int], None]:
        """Mark WHAT as the phase running now; the returned call logs its wall time."""
        self.where = f"block {block} ({arm}), {what}"
        started = time.perf_counter()

        def done(requests: int) -> None:
            self.log(f"block {block} ({arm}) {what}: {requests} requests, "
                     f"{time.perf_counter() - started:.1f} s")
        return done

    def _block(self, block: int, arm: str) -> None:
        if block == 0 or self.plan.restartable:
            self.where = f"block {block} ({arm}), the replica start"
            self._restart(arm)
        b = time.perf_counter()
        done = self._phase(block, arm, "warm-ups")
        for i, payload in enumerate(self.payloads.warmups):
            for replica in ("A", "B"):
                self._request(block, arm, "cold", replica, payload,
                              f"{payload.id}/{replica}", warmup=True,
                              salt_key=f"warm-{i}-{replica}")
        done(2 * len(self.payloads.warmups) + self._warm_burst(block, arm))
        for size in self.payloads.sizes():
            group = self.payloads.of_size(size)
            batches = [[p] for p in group] if size in self.plan.one_by_one else [group]
            for batch in batches:
                what = size if len(batches) == 1 else batch[0].id
                for step in STEPS:
                    done = self._phase(block, arm, f"{what} {step.name}")
                    if step.name == "cross":
                        self._settle(sum(prompt_size(p.prompt_tokens, p.text) for p in batch))
                        self._wait_l2(block, batch)
                    for payload in batch:
                        self._request(block, arm, step.name, step.replica, payload,
                                      payload.id)
                    self._read_splits(block, arm, step, batch)
                    done(len(batch))
        for placement in PLACEMENTS:
            sessions = self.payloads.sessions[:self.plan.sessions_per_placement]
            done = self._phase(block, arm, f"{placement} sessions")
            self._sessions(block, arm, placement, sessions, "")
            done(sum(len(s.turns) for s in sessions))
        for width in self.plan.windows:
            sessions = self.payloads.sessions[:width]
            done = self._phase(block, arm, f"window of {width}")
            wall = self._sessions(block, arm, "alternating", sessions,
                                  prefix=f"w{width}/", label=f"window-{width}")
            self.accounting.windows.setdefault((width, arm), []).append(wall)
            done(sum(len(s.turns) for s in sessions))
        self.log(f"block {block} ({arm}) done in {time.perf_counter() - b:.1f} s")

    def _restart(self, arm: str) -> None:
        started = time.perf_counter()
        self._close()
        self.pair = self.launch(arm)
        seconds = time.perf_counter() - started
        if self.pair.launches:  # what this block ran (argv, the environment set), its start
            self.run_record.launches.append({
                "arm": arm, "processes": list(self.pair.launches), "restart_s": seconds,
                "start": {name: dict(phases) for name, phases in self.pair.starts.items()}})
        if self.pair.engine_settings:
            self.run_record.engine_settings = dict(self.pair.engine_settings)
        if self.run_record.replica_placement is None:  # the same pair in every block
            placement = placed_on(self.pair.devices)
            self.run_record.replica_placement = placement
            self.run_record.notes.append(placement_note(placement))
        if self.plan.restartable:
            self.run_record.restarts_s.append(seconds)
        self.accounting.busy_s += seconds
        where = f" ({describe(self.pair.starts)})" if self.pair.starts else ""
        self.log(f"{arm}: {self.pair.description} ready in {seconds:.1f} s{where}")

    def _close(self) -> None:
        if self.pair is not None:
            pair, self.pair = self.pair, None
            leftovers = pair.close()
            self._record_offload(pair)
            if leftovers:
                raise ReplicaError(f"{pair.description}: processes {leftovers} survived the "
                                   "stop between blocks")

    def _record_offload(self, pair: ReplicaPair) -> None:
        """What the stopped pair's engines offloaded, from their logs (complete once they
        stopped), beside that block's launch record."""
        if not pair.launches or not self.run_record.launches:
            return
        traffic = logged_traffic({r.process.name: r.process.log_text()
                                  for r in pair.replicas.values() if r.process is not None})
        if traffic:
            self.run_record.launches[-1]["offload"] = traffic

    def _settle(self, tokens: int) -> None:
        seconds = self.plan.settle_s + self.plan.store_s_per_token * tokens
        if seconds > 0:
            time.sleep(seconds)
        self.accounting.settle_s += seconds

    def _wait_l2(self, block: int, batch: Sequence[Payload]) -> None:
        """In the hosts topology (the HOSTS arm), after the settle: until the L2 holds every
        whole chunk of each payload B will ask for (LMCache writes it after the store);
        what was missing when the deadline passed goes into the notes."""
        topology = self.pair.topology if self.pair is not None else None
        chunk = self.run_record.chunk_tokens or (topology.chunk if topology else None)
        if topology is None or not topology.hosts or not chunk:
            return
        tokens = {p.id: prompt_size(p.prompt_tokens, p.text) for p in batch}
        floor = self.run_record.floor
        wait = topology.wait_l2({self.salt(f"block-{block}/{p.id}"):
                                 max(tokens[p.id] - 1, 0) // chunk for p in batch},
                                sum(tokens.values()), bytes_per_token=(
                                    floor.stored_or_kv_bytes_per_token if floor else None))
        self.accounting.settle_s += wait.seconds
        if wait.missing:
            self.run_record.notes.append("L2 wait: " + "; ".join(wait.missing))

    def salt(self, key: str) -> str:
        """One cache_salt per key (a request's steps share it, so they can hit)."""
        if key not in self._salts:
            self._salts[key] = self.salts(key)
        return self._salts[key]

    def _body(self, payload: Payload, salt: str) -> dict[str, Any]:
        return request_body(payload.text, self.plan.max_tokens, salt, extra=self.plan.extra)

    def _warm_burst(self, block: int, arm: str) -> int:
        """The widest window's concurrency once per block before anything is measured
        (warm-ups, alternating replicas, fresh salts): kernels compiled on first use at a
        batch size (Triton, e.g. the fused MoE's per-size configs) are built here, not in
        a measured window of the first block. Returns how many requests it sent."""
        width = max(self.plan.windows, default=1)
        warm = self.payloads.warmups
        if width < 2 or not warm:
            return 0
        jobs = [(("A", "B")[i % 2], warm[i % len(warm)], i) for i in range(width)]
        salts = [self.salt(f"block-{block}/warm-burst-{i}") for i in range(width)]
        started = time.perf_counter()
        timings = map_concurrently(lambda job: self._timed(job[0], job[1], salts[job[2]]),
                                   jobs, width)
        self.accounting.busy_s += time.perf_counter() - started
        for (_replica, payload, i), timing in zip(jobs, timings, strict=True):
            self._record(timing, block, arm, "cold", payload, f"{payload.id}/burst-{i}",
                         warmup=True)
        return width

    def _timed(self, replica: str, payload: Payload, salt: str,
               request_id: str | None = None) -> Timing:
        assert self.pair is not None
        return stream_timing(self.pair[replica], self._body(payload, salt),
                             self.plan.timeout_s, request_id)

    def _request(self, block: int, arm: str, step: str, replica: str, payload: Payload,
                 request: str, warmup: bool = False, salt_key: str | None = None) -> None:
        salt = self.salt(f"block-{block}/{salt_key or payload.id}")
        tag = None if warmup else request_tag(_case_id(block, payload), step, replica)
        timing = self._timed(replica, payload, salt, tag)
        self.accounting.busy_s += timing.e2e_s
        if not warmup:
            self.accounting.hit(arm, step, timing)
        self._record(timing, block, arm, step, payload, request, warmup=warmup)

    def _read_splits(self, block: int, arm: str, step: Step, batch: Sequence[Payload]
                     ) -> None:
        """Where B's server says the keys of each request of the step just recorded came
        from (its log, read once for the step; nothing outside the HOSTS arm's steps on B,
        and nothing for a request whose lookup it did not log)."""
        topology = self.pair.topology if self.pair is not None else None
        if arm != "HOSTS" or step.replica != "B" or topology is None or not topology.hosts:
            return
        found = topology.splits(step.replica)
        observations = self.run_record.observations
        first = len(observations) - len(batch)  # the batch's, recorded in its order
        for i, payload in enumerate(batch, first):
            split = found.get((_case_id(block, payload), step.name, step.replica))
            if split is not None:
                observations[i] = replace(observations[i], l1_keys=split.l1,
                                          l2_keys=split.l2)

    def _record(self, timing: Timing, block: int, arm: str, step: str, payload: Payload,
                request: str, warmup: bool) -> None:
        self.run_record.observations.append(observation(
            timing, arm=arm, block=block, pair=self.pairs[block], size=payload.size,
            step=step, request=request, payload_sha256=payload.sha256,
            prompt_tokens=payload.prompt_tokens, warmup=warmup))

    def _sessions(self, block: int, arm: str, placement: str,
                  sessions: Sequence[SessionPayload], prefix: str,
                  label: str | None = None) -> float:
        """SESSIONS at once, turn by turn; when the next turn goes to the other replica,
        one settle first (a fixed session's replica reuses its own cache at once). Each
        session's wall time is the sum of its turns; returns the group's, settles aside."""
        order = PLACEMENTS[placement]
        salts = [self.salt(f"block-{block}/{prefix}{placement}/{s.id}") for s in sessions]
        walls = [0.0] * len(sessions)
        group = 0.0
        with thread_pool(len(sessions)) as pool:
            for t in range(min((len(s.turns) for s in sessions), default=0)):
                if t and order[t % len(order)] != order[(t - 1) % len(order)]:
                    self._settle(max(s.turns[t - 1].prompt_tokens or 0 for s in sessions))
                started = time.perf_counter()
                timings = list(pool.map(
                    lambda i, t=t: self._timed(order[t % len(order)], sessions[i].turns[t],
                                               salts[i]), range(len(sessions))))
                group += time.perf_counter() - started
                for i, timing in enumerate(timings):
                    walls[i] += timing.e2e_s
        self.accounting.busy_s += group
        for session, wall in zip(sessions, walls, strict=True):
            self.run_record.sessions.append(SessionObservation(
                arm=arm, block=block, pair=self.pairs[block],
                session=f"{prefix}{session.id}", placement=label or placement,
                turns=len(session.turns), wall_s=wall, payload_sha256=session.sha256))
        return group

    # -- what the run says about itself ------------------------------------------------

    @property
    def overhead_ratio(self) -> float:
        """Screening wall time over request latencies plus restarts (1.0: no overhead)."""
        busy = self.accounting.busy_s
        return self.run_record.wall_s / busy if busy > 0 else float("inf")

    def _hit_notes(self) -> list[str]:
        """The share of prompt tokens served from a cache, per step and arm: what tells a
        working pool (ON cross near 100%) from a cold one (OFF cross 0%)."""
        cached = self.accounting.cached
        if not cached:
            return ["cached tokens: the replicas reported none (no usage details)"]
        parts = []
        for step in STEP_NAMES:
            arms = [f"{arm} {100 * sum(v) / len(v):.0f}%"
                    for (arm, s), v in cached.items() if s == step]
            if arms:
                parts.append(f"{step} {', '.join(arms)}")
        return ["prompt tokens served from a cache (mean per request): " + "; ".join(parts)]

    def _window_notes(self) -> list[str]:
        """Throughput screening: each window's wall time (its turns; settles aside), the
        median over the blocks of each arm."""
        import statistics

        windows = self.accounting.windows
        parts = []
        for width in self.plan.windows:
            arms = [f"{arm} {statistics.median(windows[(width, arm)]):.2f} s"
                    for arm in dict.fromkeys(self.plan.arms) if (width, arm) in windows]
            if arms:
                turns = width * len(self.payloads.sessions[0].turns)
                parts.append(f"{width} sessions ({turns} turns) {', '.join(arms)}")
        if not parts:
            return []
        return ["concurrency windows, alternating sessions at once (median wall per block, "
                "settles aside; their sessions are recorded as w<N>/...): " + "; ".join(parts)]


def _case_id(block: int, payload: Payload) -> str:
    """A measured request's case in its X-Request-Id (request_tags): its block and payload."""
    return f"b{block}-{payload.id}"


def check_tokens(observations: Sequence[Observation], payloads: PayloadSet) -> list[str]:
    """Refusals: a measured request that served other prompt tokens than its payload has
    (where the generator knows the count), or than it served in another block."""
    known = {p.id: p for p in payloads.requests}
    seen: dict[str, Observation] = {}
    refusals = []
    for o in observations:
        if o.warmup:
            continue
        payload = known.get(o.request)
        if payload is not None and payload.prompt_tokens is not None and (
                o.prompt_tokens != payload.prompt_tokens):
            refusals.append(
                f"request {o.request} (block {o.block}, arm {o.arm}, {o.step} on "
                f"{o.replica}): served {o.prompt_tokens} prompt tokens, its payload has "
                f"{payload.prompt_tokens} (payload sha256 {o.payload_sha256[:16]})")
        first = seen.setdefault(o.request, o)
        if first.prompt_tokens != o.prompt_tokens:
            refusals.append(
                f"request {o.request}: {o.prompt_tokens} prompt tokens in block {o.block} "
                f"({o.arm}, {o.step}) but {first.prompt_tokens} in block {first.block} "
                f"({first.arm}, {first.step})")
    return refusals
