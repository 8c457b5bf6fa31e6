"""Protocol checks a client depends on, against both replicas of the pair.

Each check sends a few requests for the protocol documents of the corpus (their own
namespaces) and says what held. They run after the corpus, so a broken protocol does not
hide a cache fault, and a cache fault does not hide a broken protocol.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_sharedkv.corpus.cases import Case
from pytest_sharedkv.service.runner import Runner
from pytest_sharedkv.stack.completions import read_usage, request_body
from pytest_sharedkv.stack.pair import ReplicaError

LOGPROB_TOLERANCE = 0.1  # nats: A's cold and B's pool-served chosen-token logprobs


@dataclass(frozen=True)
class ProtocolResult:
    name: str
    ok: bool
    message: str


class ProtocolContext:
    def __init__(self, runner: Runner, cases: list[Case]) -> None:
        self.runner = runner
        self.cases = cases
        self.tokens = runner.cases.answer_tokens
        self._n = 0

    def salt(self, label: str) -> str:
        self._n += 1
        return self.runner.salts(f"protocol-{label}-{self._n}")

    def post(self, replica: str, case: Case, salt: str | None, **extra: Any
             ) -> dict[str, Any]:
        request = request_body(case.text, self.tokens, salt, logprobs=True, extra=extra)
        return self.runner.pair[replica].post(request)

    def stream(self, replica: str, case: Case, salt: str, **extra: Any
               ) -> list[dict[str, Any]]:
        request = request_body(case.text, self.tokens, salt, extra=extra)
        return self.runner.pair[replica].stream(request)


def _choice(data: dict[str, Any]) -> dict[str, Any]:
    return dict((data.get("choices") or [{}])[0])


Check = Callable[[ProtocolContext], tuple[bool, str]]
CHECKS: dict[str, Check] = {}
# the checks whose failure is a cache hit across cache_salt namespaces: their records'
# kind is isolation (tenants not separate), not protocol
ISOLATION_CHECKS = frozenset({"cache-salt-separates-namespaces",
                              "cache-salt-separates-namespaces-across-replicas"})


def check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


@check("models-endpoint-lists-the-model")
def _models(ctx: ProtocolContext) -> tuple[bool, str]:
    replica = ctx.runner.pair["A"]
    with urllib.request.urlopen(replica.base_url + "/v1/models", timeout=30) as response:
        ids = [m.get("id") for m in json.loads(response.read()).get("data", [])]
    return replica.served_model() in ids, f"/v1/models lists {ids}"


@check("usage-present-and-adds-up")
def _usage(ctx: ProtocolContext) -> tuple[bool, str]:
    usage = ctx.post("A", ctx.cases[0], ctx.salt("usage")).get("usage") or {}
    p, c, t = (usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    ok = all(isinstance(x, int) for x in (p, c, t)) and p + c == t  # type: ignore[operator]
    return ok, f"usage {usage}"


@check("prompt-tokens-match-the-corpus")
def _prompt_tokens(ctx: ProtocolContext) -> tuple[bool, str]:
    case = ctx.cases[0]
    got = read_usage(ctx.post("A", case, ctx.salt("count"))).prompt_tokens
    if case.prompt_tokens is None:
        return isinstance(got, int), f"{got} prompt tokens (the corpus does not fix a count)"
    return got == case.prompt_tokens, f"{got} prompt tokens, the corpus made {case.prompt_tokens}"


@check("cached-tokens-present-on-a-cold-request")
def _cached_present(ctx: ProtocolContext) -> tuple[bool, str]:
    cached = read_usage(ctx.post("A", ctx.cases[1], ctx.salt("present"))).cached_tokens
    return cached == 0, f"usage.prompt_tokens_details.cached_tokens = {cached}"


@check("cached-tokens-cover-a-repeat")
def _cached_repeat(ctx: ProtocolContext) -> tuple[bool, str]:
    case, salt = ctx.cases[1], ctx.salt("repeat")
    ctx.post("A", case, salt)
    data = ctx.post("A", case, salt)
    usage = read_usage(data)
    cached, prompt = usage.cached_tokens, usage.prompt_tokens
    want = case.shareable if case.shareable is not None else prompt
    ok = cached is not None and isinstance(prompt, int) and cached <= prompt and (
        cached == want if case.shareable is not None else cached > 0)
    return ok, f"repeat: {cached} of {prompt} prompt tokens cached (shareable {want})"


@check("cache-salt-separates-namespaces")
def _salt(ctx: ProtocolContext) -> tuple[bool, str]:
    case = ctx.cases[2]
    ctx.post("A", case, ctx.salt("first"))
    cached = read_usage(ctx.post("A", case, ctx.salt("second"))).cached_tokens
    return cached == 0, f"the same prompt under another cache_salt: {cached} cached"


@check("cache-salt-separates-namespaces-across-replicas")
def _salt_cross(ctx: ProtocolContext) -> tuple[bool, str]:
    import time

    case = ctx.cases[2]
    ctx.post("A", case, ctx.salt("a-side"))
    time.sleep(ctx.runner.settle_s)
    cached = read_usage(ctx.post("B", case, ctx.salt("b-side"))).cached_tokens
    return cached == 0, f"B under another cache_salt after A stored it: {cached} cached"


@check("streamed-text-equals-non-streamed")
def _stream(ctx: ProtocolContext) -> tuple[bool, str]:
    case = ctx.cases[0]
    plain = str(_choice(ctx.post("A", case, ctx.salt("plain"))).get("text", ""))
    events = ctx.stream("A", case, ctx.salt("stream"))
    streamed = "".join(str(_choice(e).get("text", "")) for e in events if e.get("choices"))
    return streamed == plain, f"streamed {streamed[:60]!r}, non-streamed {plain[:60]!r}"


@check("streamed-usage-equals-non-streamed")
def _stream_usage(ctx: ProtocolContext) -> tuple[bool, str]:
    case = ctx.cases[3]
    usage = ctx.post("A", case, ctx.salt("u1")).get("usage") or {}
    events = ctx.stream("A", case, ctx.salt("u2"), stream_options={"include_usage": True})
    last = next((e.get("usage") for e in reversed(events) if e.get("usage")), None) or {}
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    ok = bool(last) and all(last.get(k) == usage.get(k) for k in keys)
    return ok, f"streamed usage {last}, non-streamed {usage}"


@check("logprobs-present-for-every-token")
def _logprobs(ctx: ProtocolContext) -> tuple[bool, str]:
    data = ctx.post("A", ctx.cases[0], ctx.salt("lp"))
    logprobs = _choice(data).get("logprobs") or {}
    values = logprobs.get("token_logprobs") or []
    n = read_usage(data).completion_tokens
    ok = len(values) == n and all(isinstance(v, (int, float)) and v <= 1e-6 for v in values)
    ok = ok and len(logprobs.get("top_logprobs") or []) == n
    return ok, f"{len(values)} token logprobs for {n} completion tokens"


@check("logprobs-agree-across-replicas")
def _logprobs_cross(ctx: ProtocolContext) -> tuple[bool, str]:
    import time

    case, salt = ctx.cases[3], ctx.salt("lp-cross")
    a = _choice(ctx.post("A", case, salt)).get("logprobs") or {}
    time.sleep(ctx.runner.settle_s)
    b_data = ctx.post("B", case, salt)
    b = _choice(b_data).get("logprobs") or {}
    la, lb = a.get("token_logprobs") or [], b.get("token_logprobs") or []
    worst = max((abs(x - y) for x, y in zip(la, lb, strict=False)), default=float("inf"))
    ok = len(la) == len(lb) > 0 and worst <= LOGPROB_TOLERANCE
    return ok, (f"chosen-token logprobs differ by at most {worst:.3g} nats between A cold and "
                f"B with {read_usage(b_data).cached_tokens} cached tokens "
                f"(tolerance {LOGPROB_TOLERANCE})")


@check("finish-reason-length-at-max-tokens")
def _finish(ctx: ProtocolContext) -> tuple[bool, str]:
    data = ctx.post("A", ctx.cases[0], ctx.salt("finish"))
    reason = _choice(data).get("finish_reason")
    n = read_usage(data).completion_tokens
    return reason == "length" and n == ctx.tokens, f"finish_reason {reason}, {n} tokens"


@check("max-tokens-1-gives-the-first-token")
def _one(ctx: ProtocolContext) -> tuple[bool, str]:
    case = ctx.cases[0]
    full = str(_choice(ctx.post("A", case, ctx.salt("full"))).get("text", "")).split()
    one = str(_choice(ctx.post("A", case, ctx.salt("one"), max_tokens=1)).get("text", ""))
    return one.split() == full[:1], f"max_tokens=1 gave {one!r}, the answer starts {full[:1]}"


@check("stop-string-ends-the-answer")
def _stop(ctx: ProtocolContext) -> tuple[bool, str]:
    case = ctx.cases[1]
    full = str(_choice(ctx.post("A", case, ctx.salt("nostop"))).get("text", "")).split()
    if len(full) < 4:
        return False, f"answer too short for a stop check: {full}"
    stop = full[3]
    if stop in full[:3]:
        return True, "stop word repeats earlier in the answer; nothing to check"
    data = ctx.post("A", case, ctx.salt("stop"), stop=[stop])
    text, reason = str(_choice(data).get("text", "")), _choice(data).get("finish_reason")
    return text.split() == full[:3] and reason == "stop", (
        f"stop={stop!r}: {text!r} (finish_reason {reason}), expected {full[:3]}")


@check("greedy-answers-are-deterministic")
def _determinism(ctx: ProtocolContext) -> tuple[bool, str]:
    case = ctx.cases[2]
    one = _choice(ctx.post("B", case, ctx.salt("d1"))).get("text")
    two = _choice(ctx.post("B", case, ctx.salt("d2"))).get("text")
    return one == two, f"two cold greedy answers on B: {str(one)[:40]!r}, {str(two)[:40]!r}"


def run_protocol(runner: Runner) -> list[ProtocolResult]:
    cases = runner.cases.by_role("protocol") or runner.cases.by_role("measured")[:4]
    cases = (cases * 4)[:4]
    ctx = ProtocolContext(runner, cases)
    results = []
    for name, fn in CHECKS.items():
        try:
            ok, message = fn(ctx)
        except ReplicaError as exc:
            ok, message = False, str(exc).splitlines()[0]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ok, message = False, f"{type(exc).__name__}: {exc}"
        results.append(ProtocolResult(name, ok, message))
    return results
