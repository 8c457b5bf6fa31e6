"""Sending the corpus through a replica pair, in steps, and keeping every answer.

Order by steps, not by request: all cold requests on A, then A again (local reuse), one
settle (LMCache stores A's KV after A answers), all cross-replica requests on B, then B
again (receiver-local). Which steps settle first is the stack's (``expected_hits``): on
vLLM's native offload the local steps do, as they read the replica's own CPU tier, which
its engine fills after it answers. Settling per request would cost a settle per request;
ordering by steps costs one per group. Within a step requests go concurrently (the
engines batch them); each request's ``cached_tokens`` comes from its own usage, and the
split between the engine's own prefix cache and the pool (or, on native offload, the
replica's CPU tier) comes from the engines' counters, read before and after the step:
every step expects the hits its stack lets it have, so step totals account for every
request.

In the hosts topology (one LMCache server per replica, sharing an L2) the wait before B's
step is no sleep: the L2 is polled until it holds every chunk of every salt B will ask for
(a deadline names what was missing), and after B's step server 2's own account of where
each request's keys came from (its log's ``retained keys (a L1, b L2)``, by request id) is
kept beside the engines' counters. Each group ends with the L1 evictions each server
counted so far, where they count them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.corpus.cases import Case, CaseSet, SessionCase, prompt_size
from pytest_sharedkv.processes.thread_pool import map_concurrently
from pytest_sharedkv.service.answers import Answer, ServiceRun, StepTotals
from pytest_sharedkv.service.expected_hits import prefix_caching_of, remote_of, stack_of
from pytest_sharedkv.stack.completions import read_usage, request_body
from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
from pytest_sharedkv.stack.metrics import (
    EXTERNAL_HITS,
    LOCAL_HITS,
    Counters,
    counter_delta,
    counters_read,
)
from pytest_sharedkv.stack.pair import REPLICAS, ReplicaError, ReplicaPair
from pytest_sharedkv.stack.request_tags import request_tag
from pytest_sharedkv.stack.steps import OTHER, STEPS, Step

if TYPE_CHECKING:
    from pytest_sharedkv.stack.l2.log import KeySplit
    from pytest_sharedkv.stack.topology import L2Wait

Salts = Callable[[str], str]  # case or session id -> a fresh cache_salt


def read_answer(data: dict[str, Any], case: str, step: str, replica: str,
                decode: Callable[[str], tuple[int, ...]] | None, seconds: float) -> Answer:
    choice = (data.get("choices") or [{}])[0]
    usage = read_usage(data)
    text = str(choice.get("text", ""))
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    return Answer(
        case, step, replica, text, decode(text) if decode else None,
        usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens,
        choice.get("finish_reason"),
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
        self.stack = stack_of(pair.record.stack)
        self.run = ServiceRun(cases, pair.description, self.stack,
                              prefix_caching_of(pair.record.stack), remote_of(pair.record.stack),
                              gpu_kv_tokens=dict(pair.gpu_kv_tokens))
        self.expect = self.run.expect
        self._salt: dict[str, str] = {}
        self.topology = pair.topology
        # the hosts topology: (case, step) -> server 2's split of that request's lookup;
        # group -> the wait for the L2 before its B step
        self.splits: dict[tuple[str, str], KeySplit] = {}
        self.waits: dict[str, L2Wait] = {}
        # group -> the L1 evictions each server counted by its end (None: unknown)
        self.evictions: dict[str, dict[str, int | None]] = {}

    @property
    def hosts(self) -> bool:
        """Whether the pair's servers share KV only through an L2 (the hosts topology)."""
        return self.topology is not None and self.topology.hosts

    def salt(self, key: str) -> str:
        if key not in self._salt:
            self._salt[key] = self.salts(key)
        return self._salt[key]

    def send(self, replica: str, case_id: str, step: str, text: str, salt: str | None
             ) -> Answer:
        started = time.perf_counter()
        try:
            data = self.pair[replica].post(
                request_body(text, self.cases.answer_tokens, salt, logprobs=True),
                request_id=request_tag(case_id, step, replica))
        except ReplicaError as exc:
            return Answer(case_id, step, replica, seconds=time.perf_counter() - started,
                          error=str(exc).splitlines()[0])
        seconds = time.perf_counter() - started
        return read_answer(data, case_id, step, replica, self.cases.decode, seconds)

    def counters(self) -> dict[str, Counters | None]:
        return {name: self.pair[name].counters() for name in REPLICAS}

    def step(self, group: str, step: Step, cases: Sequence[Case]) -> StepTotals:
        before = self.counters()
        started = time.perf_counter()
        answers = map_concurrently(
            lambda c: self.send(step.replica, c.id, step.name, c.text, self.salt(c.id)),
            cases, self.concurrency)
        wall = time.perf_counter() - started
        after = self.counters()
        for answer in answers:
            self.run.answers[(answer.case, step.name)] = answer
        totals = step_totals(group, step, answers, before, after, wall)
        self.run.totals.append(totals)
        exact = sum(a.ids == c.expected for a, c in zip(answers, cases, strict=True))
        errors = [a.error for a in answers if a.error]
        self.log(f"{group} {step.name} on {step.replica}: {len(cases)} requests, "
                 f"{wall:.1f}s, cached {totals.cached}, local {totals.local}, "
                 f"external {totals.external}"
                 + (f" (counters of {', '.join(totals.unread)} could not be read)"
                    if totals.unread else "")
                 + (f", {exact} as constructed" if self.cases.kind == "copy" else "")
                 + (f", {len(errors)} errors (first: {errors[0]})" if errors else ""))
        if self.hosts and step.hits == "external":
            self.log(f"  {self.read_splits(step, cases)}")
        first = next((a for a, c in zip(answers, cases, strict=True)
                      if not a.error and c.expected is not None and a.ids != c.expected), None)
        if first is not None:
            self.log(f"  first wrong: {first.case} answered {first.text[:80]!r} "
                     f"(prompt {first.prompt_tokens} tokens, {first.cached_tokens} cached)")
        return totals

    def identical(self, group: str, step: Step, cases: Sequence[Case], k: int,
                  sequential: bool = False) -> tuple[dict[str, list[Answer]], StepTotals]:
        """K identical requests for each of CASES (one prompt, one salt: the case's) sent
        to STEP's replica at once, every case's together, so the engine has them in flight
        together (SEQUENTIAL: one after another, each sent once the last has answered);
        each case's answers in the order sent (their request ids differ by it:
        ``<step>-<i>``), and the counters around them all. Kept out of the run's answers,
        which hold one answer a case and step."""
        sends = [(case, i) for case in cases for i in range(1, k + 1)]
        before = self.counters()
        started = time.perf_counter()

        def send(sent: tuple[Case, int]) -> Answer:
            return self.send(step.replica, sent[0].id, f"{step.name}-{sent[1]}",
                             sent[0].text, self.salt(sent[0].id))

        answers = ([send(sent) for sent in sends] if sequential
                   else map_concurrently(send, sends, len(sends)))
        wall = time.perf_counter() - started
        totals = step_totals(group, step, answers, before, self.counters(), wall)
        found: dict[str, list[Answer]] = {}
        for (case, _), answer in zip(sends, answers, strict=True):
            found.setdefault(case.id, []).append(answer)
        self.log(f"{group} on {step.replica}: {k} identical requests of each of {len(cases)} "
                 f"prompts {'one after another' if sequential else 'at once'}, {wall:.1f}s, "
                 f"cached {totals.cached}, local "
                 f"{totals.local}, external {totals.external}")
        return found, totals

    def read_splits(self, step: Step, cases: Sequence[Case]) -> str:
        """Server 2's split of each request of STEP (its log, read once), kept by (case,
        step); the line the progress log gets."""
        from pytest_sharedkv.stack.l2.log import KeySplit

        assert self.topology is not None
        found = self.topology.splits(step.replica)
        splits = [found.get((c.id, step.name, step.replica))
                  or KeySplit(request_tag(c.id, step.name, step.replica)) for c in cases]
        for case, split in zip(cases, splits, strict=True):
            self.splits[(case.id, step.name)] = split
        return split_line(splits, self.topology.server_of(step.replica).name)

    def chain(self, group: str, cases: Sequence[Case], steps: Sequence[Step] = STEPS
              ) -> None:
        for step in steps:
            if self.expect.step(step).settle:  # it reads what an earlier step stored
                time.sleep(self.settle_for(cases, group))
            self.step(group, step, cases)
        self.count_evictions(group)

    def count_evictions(self, group: str) -> None:
        """The L1 evictions each server counted by the end of GROUP, where it counts."""
        if self.topology is not None and any(s.counts_evictions
                                             for s in self.topology.servers):
            self.evictions[group] = self.topology.evictions()
            counted = ", ".join(f"{name} {'unknown' if n is None else n}"
                                for name, n in self.evictions[group].items())
            self.log(f"{group}: L1 evictions so far: {counted}")

    def chunks(self, tokens: int) -> int:
        """The whole chunks a lookup of a TOKENS-token prompt asks for (LMCache keeps the
        last token back)."""
        chunk = (self.topology.chunk if self.topology is not None else None) \
            or self.cases.chunk or 1
        return max(tokens - 1, 0) // chunk

    def settle_for(self, cases: Sequence[Case], group: str = "gate") -> float:
        """The settle before B's step: the option, plus LMCache's store time for the
        group's tokens (it stores A's KV after A answers, and B must find it stored). In
        the hosts topology the wait happens here instead: until the L2 holds every chunk
        B will ask for of each case's salt (no sleep is left to do), or, where the L2
        cannot be listed, the settle as in the shared topology."""
        tokens = sum(prompt_size(c.prompt_tokens, c.text) for c in cases)
        if self.hosts:
            assert self.topology is not None
            wait = self.topology.wait_l2(
                {self.salt(c.id): self.chunks(prompt_size(c.prompt_tokens, c.text))
                 for c in cases}, tokens)
            self.waits[group] = wait
            self.log(f"{group}: the L2 held every chunk B asks for after {wait.seconds:.2f} s"
                     if wait.listed and not wait.missing else
                     f"{group}: L2 wait: {'; '.join(wait.missing)}" if wait.listed else
                     f"{group}: the L2 cannot be listed: the settle stands in for the wait")
            if wait.listed:
                return 0.0
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
            live = [s for s in sessions if t < len(s.turns)]
            if t and self.hosts:  # the turn before, in the L2, before the other replica
                assert self.topology is not None
                wait = self.topology.wait_l2(
                    {self.salt(s.id): self.chunks(s.turns[t - 1].prompt_tokens or 0)
                     for s in live}, sum(s.turns[t - 1].prompt_tokens or 0 for s in live))
                self.waits[f"sessions turn {t}"] = wait
                if not wait.listed:
                    time.sleep(self.settle_s)
            elif t:
                time.sleep(self.settle_s)
            answers = map_concurrently(functools.partial(self._turn, t), live,
                                       self.concurrency)
            for session, answer in zip(live, answers, strict=True):
                self.run.sessions.setdefault(session.id, []).append(answer)
            self.log(f"sessions turn {t}: {len(live)} requests")

    def _turn(self, t: int, session: SessionCase) -> Answer:
        turn = session.turns[t]
        return self.send(turn.replica, session.id, f"turn-{t}", turn.text,
                         self.salt(session.id))


def step_totals(group: str, step: Step, answers: Sequence[Answer],
                before: dict[str, Counters | None], after: dict[str, Counters | None],
                wall: float) -> StepTotals:
    """One step's totals: ANSWERS' cached tokens and the counters' deltas on both
    replicas between BEFORE and AFTER (None where one could not be read)."""
    def delta(replica: str, name: str) -> int | None:
        return counter_delta(before[replica], after[replica], name)

    other = OTHER[step.replica]
    return StepTotals(group, step.name, step.replica, len(answers),
                      delta(step.replica, LOCAL_HITS), delta(step.replica, EXTERNAL_HITS),
                      delta(other, LOCAL_HITS), delta(other, EXTERNAL_HITS), wall,
                      sum(a.cached_tokens or 0 for a in answers),
                      tuple(r for r in REPLICAS if not counters_read(before[r], after[r])))


def split_line(splits: Sequence[KeySplit], server: str) -> str:
    """One step's splits in a line: how many lookups the server logged, and their keys."""
    known = [s for s in splits if s.known]
    l1 = sum(s.l1 or 0 for s in known)
    l2 = sum(s.l2 or 0 for s in known)
    retained = sum(s.retained or 0 for s in known)
    requested = sum(s.requested or 0 for s in known)
    unknown = len(splits) - len(known)
    return (f"{server}: {retained}/{requested} retained keys ({l1} L1, {l2} L2) over "
            f"{len(known)} lookups" + (f"; {unknown} requests with no lookup logged"
                                       if unknown else ""))
