"""The cross-replica round: A cold, then B from the shared pool, exact answers and hits.

Kept out of the suite file so the suite stays thin and the logic is tested on the stub
test double. The prompts are the service corpus's first requests, so with the copy model
both answers are also checked against the answer known by construction. A wrong
continuation names the prompt, both answers and B's hit counts.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from pytest_sharedkv.corpus.cases import CaseSet
from pytest_sharedkv.engine_hooks.delay_hook import read_log, void_problem
from pytest_sharedkv.report.records import Problem, ResultSink, kinds_of, worst_kind
from pytest_sharedkv.stack import kv_audit
from pytest_sharedkv.stack.namespaces import Namespaces
from pytest_sharedkv.stack.pair import UNREAD, ReplicaPair
from pytest_sharedkv.stack.request_tags import request_tag
from pytest_sharedkv.stack.steps import step

TIER = "replica_pair"
COLD, CROSS = step("cold"), step("cross")  # the round is the first and the pool step


def delayed_calls(pair: ReplicaPair) -> Counter[str] | None:
    """Delayed KV transfers per launched process, or None when no delay was injected."""
    if pair.inject_log is None:
        return None
    return read_log(pair.inject_log)


@dataclass(frozen=True)
class RoundVerdict:
    ok: bool
    message: str
    # why B's pool hits are UNKNOWN (its counters could not be read), when nothing failed
    unknown: str = ""


def cross_replica_round(pair: ReplicaPair, namespaces: Namespaces, sink: ResultSink,
                        cases: CaseSet, prompts: int, settle_s: float) -> RoundVerdict:
    """``settle_s``: the wait between A's answer and B's request, because LMCache stores
    A's KV after A answers (a store can take seconds under an injected delay, which slows
    the server's copies); a B that comes too early reports no pool hits and fails. Both
    answers go into the report, so a failed run says what each replica said."""
    started = time.perf_counter()
    problems: list[Problem] = []
    voids: list[str] = []
    exact = 0
    external = 0
    details = []
    unread: list[str] = []
    chosen = cases.by_role("measured")[:prompts]
    for index, case in enumerate(chosen):
        namespace = namespaces(f"prompt-{index}")
        a = pair.send(COLD.replica, case.text, cases.answer_tokens, namespace.salt,
                      request_tag(case.id, COLD.name, COLD.replica))
        namespace.expect_cold(a)
        time.sleep(settle_s)
        b = pair.send(CROSS.replica, case.text, cases.answer_tokens, namespace.salt,
                      request_tag(case.id, CROSS.name, CROSS.replica))
        hit = b.external_hit_tokens or 0
        if not b.counters_read:
            unread.append(f"prompt {index}")
        external += hit
        same = a.text == b.text
        if case.expected is not None and cases.decode is not None:
            for name, reply in (("A", a), ("B", b)):
                if cases.decode(reply.text) != case.expected:
                    same = False
                    problems.append(Problem(
                        f"prompt {index} ({case.id}): replica {name} answered "
                        f"{reply.text!r}, not the answer known by construction", "divergence"))
        exact += same
        details.append({"prompt_tokens": a.prompt_tokens, "b_cached": b.cached_tokens,
                        "b_local": b.local_hit_tokens, "b_external": b.external_hit_tokens,
                        "exact": same, "a_text": a.text, "b_text": b.text,
                        "a_seconds": round(a.seconds, 3),
                        "b_seconds": round(b.seconds, 3)})
        if not same:
            problems.append(Problem(f"prompt {index} ({a.prompt_tokens} tokens): B answered "
                                    f"{b.text!r} from {hit} external hit tokens, A answered "
                                    f"{a.text!r}", "divergence"))
        if hit <= 0 and b.counters_read:
            problems.append(Problem(f"prompt {index}: B reported no external (pool) hits, so "
                                    "the cross-replica step proves nothing (is the connector "
                                    "on?)", "hits"))
    delayed = delayed_calls(pair)
    void = void_problem(delayed, "round") if delayed is not None else None
    if void:
        voids.append(void)
    audit = kv_audit.audit(pair.kv_audit_dir)
    if audit is not None:
        sink.note(TIER, audit.summary(str(pair.labels.get("allocator", ""))),
                  kind="audit-mismatch", status="void" if audit.void else "info")
        if audit.void:
            voids.insert(0, audit.void)
        problems += [Problem(m.line(), "audit-mismatch") for m in audit.mismatches[:10]]
    wall = time.perf_counter() - started
    shown = [*voids, *problems]
    unknown = (f"{UNREAD} on replica B for {', '.join(unread)}, so its pool hits are "
               "unknown" if unread else "")
    status = ("void" if voids else "fail" if problems else "unknown" if unread else "pass")
    kind = "hits-unknown" if status == "unknown" else worst_kind(kinds_of(problems),
                                                                  "divergence")
    sink.check(TIER, dict(pair.labels), exact, len(chosen),
               message="; ".join(shown[:3]) or unknown, kind=kind, status=status,
               detail={"requests": 2 * len(chosen), "external_hit_tokens": external,
                       "wall_s": round(wall, 2), "pair": pair.description,
                       "delayed_calls": dict(delayed) if delayed is not None else None,
                       "kv_audit": None if audit is None else {
                           **audit.counts(), "void": audit.void,
                           "mismatches": [m.line() for m in audit.mismatches[:200]]},
                       "prompts": details})
    head = (f"{pair.description}: {exact}/{len(chosen)} exact cross-replica answers, "
            f"{external} external hit tokens")
    return RoundVerdict(not shown, head + ("" if not shown else ": " + "; ".join(shown)),
                        unknown)
