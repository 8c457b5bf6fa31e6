"""Judging answers and hits: exact tokens against the answer known by construction and
against replica A's cold answer; hits against what each step may have.

A failure names the request, payload digest, step, source chunk, the first divergent
token, both continuations and every step's hit counts, and (when it ran) what the zero-hit
control said: if the same request answered right with a fresh ``cache_salt``, the fault
is in cache transfer or reuse, not the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_sharedkv.config.stack_choice import MP
from pytest_sharedkv.corpus.cases import Case
from pytest_sharedkv.models.copy_rule import first_divergence
from pytest_sharedkv.report.records import Problem, kinds_of, worst_kind
from pytest_sharedkv.service.answers import Answer, ServiceRun, StepTotals
from pytest_sharedkv.service.expected_hits import (
    EXTERNAL,
    LEAK,
    LOCAL,
    StepHits,
    expected_hits,
)
from pytest_sharedkv.stack.steps import STEPS, Step

if TYPE_CHECKING:
    from pytest_sharedkv.stack.l2.log import KeySplit
    from pytest_sharedkv.stack.topology import L2Wait

SHOWN_WORDS = 8


def _short(text: str) -> str:
    words = text.split()
    tail = " ..." if len(words) > SHOWN_WORDS else ""
    return repr(" ".join(words[:SHOWN_WORDS]) + tail)


def _words(ids: tuple[int, ...], run: ServiceRun, case: Case) -> str:
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, text_of

    if run.cases.kind != "copy":
        return repr(ids)
    return _short(text_of([i for i in ids if i >= 0], CopyModelRecipe()))


def diverged(run: ServiceRun, case: Case, answer: Answer, cold_step: str = "cold"
             ) -> Problem | None:
    """Why ANSWER is not the right one (a divergence), or None: against the answer by
    construction, else A's answer at COLD_STEP (the triage's cells have their own)."""
    cold = run.answer(case.id, cold_step)
    if case.expected is not None:
        if answer.ids == case.expected:
            return None
        index = first_divergence(case.expected, answer.ids or ())
        return Problem(f"first divergent token {index}: expected "
                       f"{_words(case.expected, run, case)} (by construction), replica "
                       f"{answer.replica} answered {_short(answer.text)}", "divergence")
    if cold is None or answer is cold or cold.error:
        return None
    if answer.text == cold.text:
        return None
    index = first_divergence(cold.text.split(), answer.text.split())
    return Problem(f"first divergent word {index}: replica A answered {_short(cold.text)} "
                   f"cold, replica {answer.replica} answered {_short(answer.text)}",
                   "divergence")


def hit_problem(case: Case, step: Step, answer: Answer, evicted: bool = False,
                expect: StepHits | None = None) -> Problem | None:
    """What is wrong with ANSWER's hits at STEP, against EXPECT (None: the shared pool's
    expectation of STEP; see ``expected_hits``). EVICTED: the one server evicted from its
    L1 during the pass (an L1 smaller than the corpus, one host), so a step that may stop
    short (the cross-replica hit) may fall short of the shareable prefix (never past it)."""
    expect = expect or expected_hits(MP).step(step)
    cached = answer.cached_tokens
    if cached is None:
        return Problem(f"replica {answer.replica} reported no "
                       "usage.prompt_tokens_details.cached_tokens", "hits-unknown")
    if not expect.sources:
        if cached and expect.stray == LEAK:
            return Problem(f"isolation: the cold request hit {cached} cached tokens on "
                           f"replica {answer.replica} in a fresh cache_salt namespace (KV "
                           "served across tenants)", LEAK)
        if cached:
            return Problem(f"replica {answer.replica} hit {cached} cached tokens where "
                           "nothing is shared: its own caches never saw this prompt, so the "
                           "KV came from nowhere (a cold request on it must hit none)",
                           expect.stray)
        return None
    if evicted and expect.may_stop_short and case.shareable is not None \
            and cached <= case.shareable:
        return None
    if expect.full and case.shareable is not None and cached != case.shareable:
        return Problem(f"replica {answer.replica} took {cached} of the {case.shareable} "
                       f"shareable prompt tokens from {expect.where} (a full hit leaves "
                       "exactly one to compute)", "hits")
    return None


def gap_hit_problem(case: Case, answer: Answer, gap: int, chunk: int) -> Problem | None:
    """The L2 fault cell's hit: chunk GAP of server 2's L2 load failed, so B takes exactly
    the GAP chunks of CHUNK tokens before it; a hit past the gap (KV B never loaded, or
    took from somewhere else) or short of it fails."""
    cached, prefix = answer.cached_tokens, gap * chunk
    where = f"request {case.id}, step {answer.step} on replica {answer.replica}"
    if cached is None:
        return Problem(f"{where}: no usage.prompt_tokens_details.cached_tokens",
                       "hits-unknown")
    if cached > prefix:
        return Problem(f"{where}: a hit past the gap: {cached} tokens cached, but chunk {gap} "
                       f"of server 2's L2 load failed, so only the {prefix} before it may "
                       "hit", "hits")
    if cached < prefix:
        return Problem(f"{where}: {cached} tokens cached, short of the {prefix} before the "
                       f"gap at chunk {gap} (server 2's L2 held them)", "hits")
    return None


def failed_requests(run: ServiceRun, cases: list[Case], step: str) -> int:
    """CASES whose request at STEP got no answer (an error, or none recorded)."""
    return sum(1 for c in cases if (a := run.answer(c.id, step)) is None or a.error)


def step_problems(run: ServiceRun, case: Case, step: Step, check_hits: bool = True,
                  evicted: bool = False) -> list[Problem]:
    """What is wrong at STEP of CASE's chain: its answer, and (CHECK_HITS) its hits
    against what the run's stack lets that step hit."""
    answer = run.answer(case.id, step.name)
    if answer is None:
        return [Problem(f"{step.name}: no answer was recorded", "error")]
    if answer.error:
        return [Problem(f"{step.name} on replica {step.replica}: {answer.error}", "error")]
    problems = []
    wrong = diverged(run, case, answer)
    if wrong:
        problems.append(wrong)
    if check_hits:
        hit = hit_problem(case, step, answer, evicted, run.expect.step(step))
        if hit:
            problems.append(hit)
    return problems


def hit_line(run: ServiceRun, case: Case) -> str:
    parts = []
    for step in STEPS:
        answer = run.answer(case.id, step.name)
        if answer is not None:
            parts.append(f"{step.name} on {step.replica}: {answer.cached_tokens} cached")
    return "; ".join(parts)


def control_line(run: ServiceRun, case: Case, step: Step) -> str:
    control = run.controls.get((case.id, step.name))
    if control is None:
        return ""
    if control.error:
        return f"zero-hit control on {control.replica}: {control.error}"
    if diverged(run, case, control) is None:
        return (f"zero-hit control (same request, fresh cache_salt, replica {control.replica}):"
                " right, so the fault is in cache transfer or reuse, not the model")
    return (f"zero-hit control (same request, fresh cache_salt, replica {control.replica}): "
            "wrong too, so the model or engine is at fault, not the cache")


def chain_failures(run: ServiceRun, case: Case, evicted: bool = False) -> list[Problem]:
    """One message per failed step of this case's chain (empty: all four held), each of
    the worst kind its step found (EVICTED: see hit_problem)."""
    out = []
    for step in STEPS:
        problems = step_problems(run, case, step, evicted=evicted)
        if problems:
            head = (f"request {case.id} (payload sha256 {case.sha256[:16]}), step {step.name}"
                    f" on replica {step.replica}"
                    + (f", source chunk {case.source_chunk}"
                       if case.source_chunk is not None else ""))
            tail = [hit_line(run, case), control_line(run, case, step)]
            out.append(Problem(head + ": " + "; ".join(problems) + " [" +
                               "; ".join(t for t in tail if t) + "]",
                               worst_kind(kinds_of(problems), "error")))
    return out


def totals_unknown(totals: StepTotals) -> str | None:
    """Why a step's hit accounting is UNKNOWN (a replica's counters could not be read
    before or after it), or None: a failed scrape is no evidence either way."""
    if not totals.unread:
        return None
    return (f"{totals.group} {totals.step} on {totals.replica}: counters could not be read "
            f"on replica {', '.join(totals.unread)}, so the step's hits are unknown")


def totals_problems(totals: StepTotals, shareable: int | None, evicted: bool = False,
                    expect: StepHits | None = None) -> list[Problem]:
    """What a step's counter deltas say against what the step may have, EXPECT (None: the
    shared pool's expectation of a step of that name; nothing where they are unknown: see
    totals_unknown).

    The pool counter (``vllm:external_prefix_cache_hits``) counts hit tokens and must equal
    the responses' ``cached_tokens``; the engine's own prefix-cache counter is only read as
    zero or not: for a hybrid model vLLM 0.26 counts it per KV-cache group and scheduling
    step (57,152 counted for 12,032 cached tokens on an H200), not per token. A step that
    may hit both (native offload's local steps) is judged on the sum: the external counter
    no more than the cached tokens, the rest shown by a non-zero local counter."""
    expect = expect or expected_hits(MP).totals(totals.step)
    where = f"{totals.group} {totals.step} on {totals.replica}"
    if totals.unread:
        return []
    if totals.local is None or totals.external is None:
        return [Problem(f"{where}: the engine exposes no "
                        f"{'local' if totals.local is None else 'pool'} hit counter, so the "
                        "split cannot be accounted", "hits-unknown")]
    problems = []
    if not expect.sources and (totals.local or totals.external):
        if expect.stray == LEAK:
            problems.append(Problem(f"{where}: {totals.local} local and {totals.external} "
                                    "pool hit tokens in cold requests (isolation: KV served "
                                    "across cache_salt namespaces)", LEAK))
        else:
            problems.append(Problem(
                f"{where}: {totals.local} local and {totals.external} external hit tokens "
                f"where nothing is shared: replica {totals.replica}'s own caches never saw "
                "these prompts, so the KV came from nowhere", expect.stray))
    problems += [Problem(text, "hits")
                 for text in _hit_counts(totals, shareable, where, evicted, expect)]
    return problems


def _hit_counts(totals: StepTotals, shareable: int | None, where: str,
                evicted: bool, expect: StepHits) -> list[str]:
    """What a step's counters say against the hits EXPECT lets it have (not a leak)."""
    problems = []
    sources, expected = expect.sources, totals.cached
    external, local = totals.external or 0, totals.local or 0
    if expect.split and sources == (LOCAL,) and external:
        problems.append(f"{where}: {external} tokens came from the pool where the "
                        "engine's own prefix cache should have served")
    if expect.split and sources == (EXTERNAL,) and local:
        problems.append(f"{where}: {local} tokens hit replica {totals.replica}'s own "
                        "prefix cache " + expect.no_local.format(replica=totals.replica))
    if expect.split and expect.exact_counter == EXTERNAL and external != expected:
        problems.append(f"{where}: the engine counted {external} pool hit tokens, its "
                        f"responses reported {expected} cached")
    both = expect.split and EXTERNAL in sources and LOCAL in sources
    if both and external > expected:
        problems.append(f"{where}: the engine counted {external} external hit tokens "
                        f"({expect.external_is}), more than the {expected} its responses "
                        "reported cached")
    if expect.split and sources == (LOCAL,) and expected and not local:
        problems.append(f"{where}: the responses reported {expected} cached tokens but the "
                        "engine counted no hits in its own prefix cache")
    if both and expected > external and not local:
        problems.append(f"{where}: the responses reported {expected} cached tokens, the "
                        f"external counter {external} of them ({expect.external_is}), but "
                        f"the engine counted no hits in its own prefix cache for the other "
                        f"{expected - external}")
    short_by_eviction = evicted and expect.may_stop_short and shareable is not None \
        and expected <= shareable
    if shareable is not None and expect.full and expected != shareable \
            and not short_by_eviction:
        problems.append(f"{where}: {expected} of {shareable} shareable tokens were cached")
    if totals.other_local or totals.other_external:
        problems.append(f"{where}: replica {'B' if totals.replica == 'A' else 'A'} counted "
                        f"{totals.other_local} local and {totals.other_external} pool hits "
                        "while it had no requests")
    return problems


def turn_hit_problem(run: ServiceRun, where: str, index: int, replica: str,
                     source_chunk: int | None, answer: Answer,
                     earlier: Sequence[str]) -> Problem | None:
    """What is wrong with a session turn's hits (turn INDEX on REPLICA; EARLIER: the
    replicas of the session's earlier turns). On a stack whose replicas share KV, every
    turn but the first must have recovered its distant source from a cache (cached tokens
    past SOURCE_CHUNK); where they share nothing (``StackHits.shared``), a turn on a
    replica that served no earlier turn has nothing to recover it from, so it hits none
    (a hit is KV from nowhere), and a later turn on a replica must recover it from what
    that replica cached of its own earlier turn."""
    chunk, cached = run.cases.chunk, answer.cached_tokens or 0
    if not run.expect.shared and replica not in earlier:
        if cached:
            return Problem(f"{where}: {cached} cached tokens, but replica {replica} served no "
                           f"earlier turn of this session and the {run.stack} stack shares "
                           "nothing between replicas: the KV came from nowhere", "hits")
        return None
    if index and source_chunk is not None and chunk and cached <= source_chunk * chunk:
        return Problem(f"{where}: only {answer.cached_tokens} cached tokens, so "
                       "the distant source was recomputed, not recovered from a "
                       "cache", "hits")
    return None


def split_problems(run: ServiceRun, splits: Mapping[tuple[str, str], KeySplit],
                   cases: Sequence[Case], step: Step, server: str = "server 2",
                   gap: int | None = None) -> tuple[list[Problem], list[str]]:
    """The hosts topology's cross-replica step, by the server's own account: each request
    must have been served by SERVER (B's, which never saw the prompt) from the L2 alone.
    Keys from its own L1, or from nowhere, fail ("hits"), naming the split; GAP (the fault
    cell): exactly the GAP chunks before it, all from the L2. A request that hit but of
    which the server logged no lookup is unknown (the second list), never a pass."""
    problems: list[Problem] = []
    unknown: list[str] = []
    for case in cases:
        answer = run.answer(case.id, step.name)
        if answer is None or answer.error:
            continue
        split = splits.get((case.id, step.name))
        where = f"request {case.id}, step {step.name} on replica {step.replica}"
        if split is None or not split.known:
            if answer.cached_tokens:
                unknown.append(f"{where}: {answer.cached_tokens} tokens cached, and {server} "
                               "logged no lookup of it: where they came from is unknown")
            else:
                problems.append(Problem(f"{where}: served from nowhere: nothing cached, and "
                                        f"{server} logged no lookup that hit", "hits"))
            continue
        if split.l1:
            problems.append(Problem(f"{where}: {server} took {split.l1} keys from its own L1, "
                                    f"which never saw this prompt: {split.describe()}", "hits"))
        elif not split.l2:
            problems.append(Problem(f"{where}: served from nowhere: {split.describe()}",
                                    "hits"))
        elif gap is not None and (split.l2 != gap or split.retained != gap):
            problems.append(Problem(f"{where}: with chunk {gap} failing to load from the L2, "
                                    f"{server} must retain exactly the {gap} chunks before "
                                    f"it: {split.describe()}", "hits"))
    return problems, unknown


def hosts_step(run: ServiceRun, splits: Mapping[tuple[str, str], KeySplit],
               wait: L2Wait | None, cases: Sequence[Case], step: Step,
               server: str = "server 2", gap: int | None = None
               ) -> tuple[list[Problem], list[str], dict[str, object]]:
    """A cross-replica step of the hosts topology: its problems (the wait for the L2 that
    ran out, then each request's split), what is unknown, and the record's detail (the
    step's split summed, the wait)."""
    problems, unknown = split_problems(run, splits, cases, step, server, gap)
    if wait is not None and wait.missing:
        problems.insert(0, Problem("the L2 did not hold every chunk B asks for before B's "
                                   "step: " + "; ".join(wait.missing[:3]), "hits"))
    mine = [splits.get((c.id, step.name)) for c in cases]
    known = [s for s in mine if s is not None and s.known]
    detail: dict[str, object] = {
        "server": server, "lookups": len(known), "unlogged": len(mine) - len(known),
        "retained": sum(s.retained or 0 for s in known),
        "requested": sum(s.requested or 0 for s in known),
        "l1": sum(s.l1 or 0 for s in known), "l2": sum(s.l2 or 0 for s in known),
        "l2_wait": wait.as_dict() if wait is not None else None}
    return problems, unknown, detail


def evicted(evictions: Mapping[str, int | None] | None) -> bool:
    """Whether a server counted an L1 eviction (unknown counts are no evidence of one)."""
    return any((n or 0) > 0 for n in (evictions or {}).values())
