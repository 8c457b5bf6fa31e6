"""A size group's KV against each replica's GPU KV cache, which the engine's start log says
(``stack.engine_start.gpu_kv_tokens``: vLLM 0.26.0's ``GPU KV cache size: N tokens``).

On a shared pool a local step (A again after its cold step, B again after its cross step)
expects its own prefix cache alone (``expected_hits``). That holds only while the GPU KV
cache keeps the whole group between the two steps: where the group's KV (every prompt and
its answer, in tokens) is more than the cache holds, vLLM's prefix cache evicts the least
recently used blocks over the scan, so by the time the step asks a prompt again its blocks
are gone and the connector loads them from the pool (or part from each, where a prefix was
left). Such a step is judged by ``expected_hits.past_gpu`` (either source, in any mix,
together still the shareable prefix) and a note says where its hits came from and why.
Every other check keeps its force; where a capacity or a group's tokens are unknown (no
start line, external endpoints, a corpus that does not know its prompts' tokens) the step
is judged as before. Reported before the pass too (``header_line``), so a user sees why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_sharedkv.corpus.cases import Case
from pytest_sharedkv.service.answers import ServiceRun, StepTotals
from pytest_sharedkv.service.expected_hits import LOCAL, StackHits, StepHits, past_gpu
from pytest_sharedkv.stack.steps import STEPS

SOURCE = "vLLM's start log"  # where a capacity comes from, in the lines


@dataclass(frozen=True)
class GpuFit:
    """GROUP's KV (GROUP_TOKENS over REQUESTS prompts and their answers; None: unknown)
    against REPLICA's GPU KV cache (CAPACITY tokens; None: unknown)."""

    replica: str
    group: str
    requests: int
    group_tokens: int | None
    capacity: int | None

    @property
    def known(self) -> bool:
        return self.group_tokens is not None and self.capacity is not None

    @property
    def exceeds(self) -> bool:
        """The group's KV is more than the cache holds (False where either is unknown)."""
        return (self.group_tokens is not None and self.capacity is not None
                and self.group_tokens > self.capacity)

    def record(self) -> dict[str, Any]:
        """The record's evidence: the capacity, the group's KV, whether it exceeds (None:
        unknown)."""
        return {"gpu_kv_tokens": self.capacity, "group_kv_tokens": self.group_tokens,
                "exceeds_gpu_kv": self.exceeds if self.known else None}


def group_kv_tokens(cases: Sequence[Case], answer_tokens: int) -> int | None:
    """The KV a group of CASES leaves in an engine's cache: every prompt (``<s>``
    included) and its answer, in tokens; None where a prompt's tokens are unknown."""
    if not cases or any(c.prompt_tokens is None for c in cases):
        return None
    return sum((c.prompt_tokens or 0) + answer_tokens for c in cases)


def gpu_fit(run: ServiceRun, replica: str, group: str, cases: Sequence[Case]) -> GpuFit:
    """GROUP (its CASES) against REPLICA's GPU KV cache as RUN knows it."""
    return GpuFit(replica, group, len(cases),
                  group_kv_tokens(cases, run.cases.answer_tokens),
                  run.gpu_kv_tokens.get(replica))


def judged(expect: StepHits, fit: GpuFit) -> StepHits:
    """What a step may hit, its group's FIT considered: ``past_gpu`` where the group's KV
    exceeds the replica's GPU KV cache, else EXPECT."""
    return past_gpu(expect) if fit.exceeds else expect


def pool_note(totals: StepTotals, fit: GpuFit, expect: StepHits) -> str | None:
    """The line that says a step meant for the replica's own prefix cache (EXPECT: its
    own only) was served, wholly or in part, by the pool because its group did not fit;
    None where it fits, is unknown, or the pool served none of it."""
    if not fit.exceeds or expect.sources != (LOCAL,) or not totals.external \
            or totals.unread:
        return None
    return (f"{totals.group} {totals.step} on {totals.replica}: {totals.external:,} of "
            f"{totals.cached:,} cached tokens came from the pool: the group "
            f"({fit.group_tokens:,} tokens: {fit.requests} prompts and their answers) "
            f"exceeds replica {fit.replica}'s GPU KV cache ({fit.capacity:,} tokens, "
            f"{SOURCE}), so its own prefix cache evicted them")


def _own_steps(expect: StackHits) -> list[tuple[str, str]]:
    """The (step, replica) of each step that may hit only the replica's own prefix cache."""
    return [(s.name, s.replica) for s in STEPS if expect.totals(s.name).sources == (LOCAL,)]


def header_line(run: ServiceRun, launched_engines: bool) -> str | None:
    """Before the pass: each replica's GPU KV cache and the size groups whose KV does not
    fit, whose own-prefix-cache steps the pool may then serve. None where no capacity is
    known and the suite launched no engine (the stub without one, external endpoints)."""
    capacities = {name: run.gpu_kv_tokens.get(name) for name in ("A", "B")}
    if all(n is None for n in capacities.values()):
        if not launched_engines:
            return None
        return ("GPU KV cache: unknown (no \"GPU KV cache size\" line in the engines' start "
                "logs), so each local step expects its replica's own prefix cache alone")
    said = ", ".join(f"replica {name} " + (f"{n:,} tokens" if n is not None else "unknown")
                     for name, n in capacities.items())
    steps = _own_steps(run.expect)
    over: list[str] = []
    for size in run.cases.sizes():
        cases = [c for c in run.cases.cases if c.role == "measured" and c.size == size]
        tokens = group_kv_tokens(cases, run.cases.answer_tokens)
        evicting = [f"{step} on {replica}" for step, replica in steps
                    if gpu_fit(run, replica, size, cases).exceeds]
        if evicting and tokens is not None:
            over.append(f"the {size} group ({tokens:,} tokens: {len(cases)} prompts and their "
                        f"answers) does not fit, so its {' and '.join(evicting)} may be "
                        "served by the pool")
    if not steps:
        return f"GPU KV cache ({SOURCE}): {said}"
    return (f"GPU KV cache ({SOURCE}): {said}; "
            + ("; ".join(over) if over else "every size group fits"))
