"""What a service pass records, as plain data: every answer with its counters, and the
per-step totals (the steps themselves are stack.steps'). The runner fills it; checks,
references and the summary read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_sharedkv.corpus.cases import CaseSet
from pytest_sharedkv.service.expected_hits import StackHits, expected_hits


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
    # replicas whose counters could not be read before or after the step: their deltas
    # are None and the step's hit accounting is UNKNOWN (neither a pass nor a failure)
    unread: tuple[str, ...] = ()


@dataclass
class ServiceRun:
    """Everything one pass of the corpus produced (per replica pair)."""

    cases: CaseSet
    pair: str
    stack: str = "mp"  # the stack the pair runs (config.stack_choice): what hits it expects
    prefix_caching: bool = True  # vLLM's GPU prefix cache on (expected_hits: off, LMCache's)
    remote: bool = True  # the in-process stack's replicas share a remote (off: nothing shared)
    # each replica's GPU KV cache in tokens, from its engine's start log (None: unknown)
    gpu_kv_tokens: dict[str, int | None] = field(default_factory=dict)
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    totals: list[StepTotals] = field(default_factory=list)
    sessions: dict[str, list[Answer]] = field(default_factory=dict)
    controls: dict[tuple[str, str], Answer] = field(default_factory=dict)
    gate: Any = None  # sensitivity.GateResult
    protocol: list[Any] = field(default_factory=list)  # protocol.ProtocolResult
    twins: Any = None  # execute.TwinsCell: identical requests in flight together
    sequence: Any = None  # execute.TwinsCell: identical requests one after another
    boundary: Any = None  # execute.BoundaryCell: prompts at whole offload blocks
    wall_s: float = 0.0
    error: str | None = None  # a replica died: every result says so

    @property
    def expect(self) -> StackHits:
        """What each step of this run may hit (``expected_hits``, for its configuration)."""
        return expected_hits(self.stack, self.prefix_caching, self.remote)

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
