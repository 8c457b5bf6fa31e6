"""Sending the corpus through a replica pair, in steps, and keeping every answer.

Order by steps, not by request: all cold requests on A, then A again (local reuse), one
settle (LMCache stores A's KV after A answers), all cross-replica requests on B, then B
again (receiver-local). Settling per request would cost a settle per request; ordering by
steps costs one per group. Within a step requests go concurrently (the engines batch
them); each request's ``cached_tokens`` comes from its own usage, and the split between
the engine's own prefix cache and the pool comes from the engines' counters, read before
and after the step: every step expects one kind of hit only, so step totals account for
every request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pytest_sharedkv.replicas.pair import (
    EXTERNAL_HITS,
    LOCAL_HITS,
    ReplicaError,
    ReplicaPair,
    counter_delta,
)
from pytest_sharedkv.service.cases import Case, CaseSet


@dataclass(frozen=True)
class Step:
    name: str
    replica: str
    hits: str  # the only kind of hit this step may have: none | local | external


STEPS = (Step("cold", "A", "none"), Step("local", "A", "local"),
         Step("cross", "B", "external"), Step("receiver-local", "B", "local"))
OTHER = {"A": "B", "B": "A"}
STORE_S_PER_TOKEN = 40e-6  # LMCache MP server store time per prompt token, with margin


@dataclass(frozen=True)
class Answer:
    case: str
    step: str
    replica: str
    text: str = ""
    ids: tuple[int, ...] | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    logprobs: tuple[float, ...] | None = None
    seconds: float = 0.0
    error: str | None = None

    def to_data(self) -> dict[str, Any]:
        return {"text": self.text, "ids": list(self.ids) if self.ids is not None else None,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "finish_reason": self.finish_reason, "seconds": round(self.seconds, 3),
                "error": self.error}


@dataclass(frozen=True)
class StepTotals:
    """One step of one group: counter deltas on both replicas, requests, wall time."""

    group: str
    step: str
    replica: str
    requests: int
    local: int | None  # on the step's replica
    external: int | None
    other_local: int | None  # on the other replica: must stay 0
    other_external: int | None
    wall_s: float
    cached: int  # sum of the requests' usage.cached_tokens


@dataclass
class ServiceRun:
    """Everything one pass of the corpus produced (per replica pair)."""

    cases: CaseSet
    pair: str
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    totals: list[StepTotals] = field(default_factory=list)
    sessions: dict[str, list[Answer]] = field(default_factory=dict)
    controls: dict[tuple[str, str], Answer] = field(default_factory=dict)
    gate: Any = None  # sensitivity.GateResult
    protocol: list[Any] = field(default_factory=list)  # protocol.ProtocolResult
    wall_s: float = 0.0
    error: str | None = None  # a replica died: every result says so

    def answer(self, case: str, step: str) -> Answer | None:
        return self.answers.get((case, step))

    def _answered(self) -> list[Answer]:
        everything = [*self.answers.values(), *self.controls.values(),
                      *(a for turns in self.sessions.values() for a in turns)]
        return [a for a in everything if not a.error]

    @property
    def requests(self) -> int:
        """Requests answered (steps, gate, controls, sessions; protocol checks aside)."""
        return len(self._answered())

    @property
    def request_seconds(self) -> float:
        """The sum of those requests' latencies."""
        return sum(a.seconds for a in self._answered())


Salts = Callable[[str], str]  # case or session id -> a fresh cache_salt


REQUEST_TAG = "sharedkv"  # X-Request-Id: sharedkv.<case>.<step>.<replica>


def request_tag(case_id: str, step: str, replica: str) -> str:
    """The X-Request-Id the runner sends: vLLM names its engine request after it
    (cmpl-<tag>-<n>-<suffix>), so the in-engine KV audit can name the request."""
    return f"{REQUEST_TAG}.{case_id}.{step}.{replica}"


def parse_request_tag(engine_request_id: str) -> tuple[str, str, str] | None:
    """(case, step, replica) from an engine request id, or None for untagged requests."""
    at = engine_request_id.find(REQUEST_TAG + ".")
    if at < 0:
        return None
    parts = engine_request_id[at:].split(".")
    if len(parts) < 4:
        return None
    return parts[1], parts[2], parts[3].split("-")[0]


def body(case_text: str, tokens: int, salt: str | None, logprobs: bool = True
         ) -> dict[str, object]:
    out: dict[str, object] = {"prompt": case_text, "max_tokens": tokens, "temperature": 0.0}
    if logprobs:
        out["logprobs"] = 1
    if salt is not None:
        out["cache_salt"] = salt
    return out


def read_answer(data: dict[str, Any], case: str, step: str, replica: str,
                decode: Callable[[str], tuple[int, ...]] | None, seconds: float) -> Answer:
    choice = (data.get("choices") or [{}])[0]
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    text = str(choice.get("text", ""))
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    return Answer(
        case, step, replica, text, decode(text) if decode else None,
        usage.get("prompt_tokens"), details.get("cached_tokens"),
        usage.get("completion_tokens"), choice.get("finish_reason"),
        tuple(float(x) for x in logprobs if x is not None) if logprobs else None, seconds)


class Runner:
    def __init__(self, pair: ReplicaPair, cases: CaseSet, salts: Salts,
                 settle_s: float, concurrency: int = 8,
                 log: Callable[[str], None] | None = None,
                 store_s_per_token: float = STORE_S_PER_TOKEN) -> None:
        self.pair = pair
        self.cases = cases
        self.salts = salts
        self.settle_s = settle_s
        self.store_s_per_token = store_s_per_token
        self.concurrency = concurrency
        self.log = log or (lambda line: None)
        self.run = ServiceRun(cases, pair.description)
        self._salt: dict[str, str] = {}

    def salt(self, key: str) -> str:
        if key not in self._salt:
            self._salt[key] = self.salts(key)
        return self._salt[key]

    def send(self, replica: str, case_id: str, step: str, text: str, salt: str | None
             ) -> Answer:
        started = time.perf_counter()
        try:
            data = self.pair[replica].post(body(text, self.cases.answer_tokens, salt),
                                           request_id=request_tag(case_id, step, replica))
        except ReplicaError as exc:
            return Answer(case_id, step, replica, seconds=time.perf_counter() - started,
                          error=str(exc).splitlines()[0])
        seconds = time.perf_counter() - started
        return read_answer(data, case_id, step, replica, self.cases.decode, seconds)

    def counters(self) -> dict[str, dict[str, float]]:
        return {name: self.pair[name].counters() for name in ("A", "B")}

    def step(self, group: str, step: Step, cases: Sequence[Case]) -> StepTotals:
        before = self.counters()
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            answers = list(pool.map(
                lambda c: self.send(step.replica, c.id, step.name, c.text, self.salt(c.id)),
                cases))
        wall = time.perf_counter() - started
        after = self.counters()
        for answer in answers:
            self.run.answers[(answer.case, step.name)] = answer

        def delta(replica: str, name: str) -> int | None:
            return counter_delta(before[replica], after[replica], name)

        other = OTHER[step.replica]
        totals = StepTotals(group, step.name, step.replica, len(cases),
                            delta(step.replica, LOCAL_HITS), delta(step.replica, EXTERNAL_HITS),
                            delta(other, LOCAL_HITS), delta(other, EXTERNAL_HITS), wall,
                            sum(a.cached_tokens or 0 for a in answers))
        self.run.totals.append(totals)
        exact = sum(a.ids == c.expected for a, c in zip(answers, cases, strict=True))
        errors = [a.error for a in answers if a.error]
        self.log(f"{group} {step.name} on {step.replica}: {len(cases)} requests, "
                 f"{wall:.1f}s, cached {totals.cached}, local {totals.local}, "
                 f"external {totals.external}"
                 + (f", {exact} as constructed" if self.cases.kind == "copy" else "")
                 + (f", {len(errors)} errors (first: {errors[0]})" if errors else ""))
        first = next((a for a, c in zip(answers, cases, strict=True)
                      if not a.error and c.expected is not None and a.ids != c.expected), None)
        if first is not None:
            self.log(f"  first wrong: {first.case} answered {first.text[:80]!r} "
                     f"(prompt {first.prompt_tokens} tokens, {first.cached_tokens} cached)")
        return totals

    def chain(self, group: str, cases: Sequence[Case]) -> None:
        for step in STEPS:
            if step.name == "cross":
                time.sleep(self.settle_for(cases))
            self.step(group, step, cases)

    def settle_for(self, cases: Sequence[Case]) -> float:
        """The settle before B's step: the option, plus LMCache's store time for the group
        (it stores after A answers: ~34 us per token on an H200, 864 tokens in 0.029 s;
        with 2 s per million tokens, 32k and 128k groups reached B only 24-28% stored)."""
        tokens = sum(c.prompt_tokens or len(c.text.split()) for c in cases)
        return self.settle_s + self.store_s_per_token * tokens

    def zero_hit_controls(self, cases: Sequence[Case]) -> None:
        """Every failed (case, step) again on the same replica, cold (a fresh salt): if
        that answer is right, the fault is in cache transfer or reuse, not the model."""
        from pytest_sharedkv.service.checks import step_problems

        failed = [(case, step) for case in cases for step in STEPS
                  if (case.id, step.name) in self.run.answers
                  and step_problems(self.run, case, step, check_hits=False)]
        for case, step in failed:
            self.run.controls[(case.id, step.name)] = self.send(
                step.replica, case.id, f"{step.name}-control", case.text,
                self.salts(f"{case.id}-control-{step.name}"))

    def sessions(self) -> None:
        """Turn t of every session at once, one settle, then turn t+1 (on the other
        replica): each turn's prefix comes from the pool the other replica filled."""
        sessions = self.cases.sessions
        if not sessions:
            return
        turns = max(len(s.turns) for s in sessions)
        for t in range(turns):
            if t:
                time.sleep(self.settle_s)
            live = [s for s in sessions if t < len(s.turns)]
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                answers = list(pool.map(
                    lambda s, t=t: self.send(s.turns[t].replica, s.id, f"turn-{t}",
                                             s.turns[t].text, self.salt(s.id)), live))
            for session, answer in zip(live, answers, strict=True):
                self.run.sessions.setdefault(session.id, []).append(answer)
            self.log(f"sessions turn {t}: {len(live)} requests")
