"""What each step may hit, per stack, as data: the service tier's hit checks
(``checks.hit_problem``, ``checks.totals_problems``) read it instead of branching on the
stack.

On ``mp`` and ``inprocess`` the replicas share a pool: A's local step hits its own prefix
cache, B's cross step the pool (``vllm:external_prefix_cache_hits``, token for token the
responses' ``cached_tokens``), B's receiver-local step its own prefix cache.

A shared pool's local step holds only while the replica's GPU KV cache keeps the size
group between the step before and this one. Where the group's KV is more than that cache
(``service.gpu_fit``: each engine's start log says its size), vLLM's prefix cache evicts
least recently used blocks over the scan, so by the time the step asks a prompt again its
blocks are gone and the connector loads them from the pool: the step is judged by
``past_gpu``, its own prefix cache and the pool in any mix (as a native local step is),
together still the shareable prefix, the external counter no more than the cached tokens.

On ``native`` (vLLM's ``OffloadingConnector``) each replica has a CPU tier of its own and
its GPU cache is too small to keep a size group between the group's cold and local steps
(``stack.native_offload.gpu_blocks``). Read from vLLM's scheduler
(``v1/core/sched/scheduler.py``, ``schedule``): a waiting request takes its GPU prefix hit
first (``get_computed_blocks``), then asks the connector for what lies past it
(``get_num_new_matched_tokens(request, num_new_local_computed_tokens)``); the request's
``num_cached_tokens``, the response's ``cached_tokens``, is the sum of the two, and the
connector's part alone is recorded in ``connector_prefix_cache_stats``, which
``vllm:external_prefix_cache_hits`` counts. So a native local or receiver-local step may
hit from either source, in any mix that eviction left: the GPU (``local``) and the
replica's own CPU tier (``external``). Which one serves a prompt is the eviction's choice,
not the stack's contract, so either is accepted, but together they must cover the
shareable prefix (whole offload blocks: the copy corpus's prompts are ``m * chunk + 1``
tokens and a chunk is whole engine blocks); the external counter can then be no more than
the cached tokens, and what it does not account for must show in the local counter.
B's cross step has nothing to share (B's CPU tier never saw A's prompts): a cold request
on B, 0 cached tokens, answers still exact; a hit there is KV from nowhere.

On ``inprocess`` with vLLM's prefix caching off (``--no-sharedkv-inprocess-prefix-caching``,
LMCache #4463's later configuration) no step can hit the GPU prefix cache: vLLM asks the
connector for everything past a local hit of 0, so what was local comes from the
replica's own LMCache (its ``local_cpu``, or the remote behind it), counted as external,
token for token the cached tokens; a local hit there means the flag was not applied.

On ``inprocess`` with no remote (``--sharedkv-inprocess-remote none``, the launch
record's ``remote_url`` None: LMCache's ``local_cpu`` alone, #4463's configuration) the
replicas share nothing: each step as on ``native``, its own prefix cache and its own
LMCache in any mix (or LMCache alone, with the prefix cache off), nothing on the cross
step; the record says "gate": "none", so the gate is unproven.

The identical-requests check (``Twins``): one prompt cold on A, its KV stored, then the
same prompt under the same salt K times at once to one replica. On the shared pool they go
to B: the first scheduled loads the pool; one scheduled after it may find the blocks in
B's own prefix cache, so the twins may hit either source, in any mix, but each its whole
shareable prefix. Where nothing crosses (``native``, ``inprocess`` with no remote) they go
to A, where its own GPU cache and CPU tier hold the prompt (as its local step). With the
prefix cache off they go to A too, each loading from A's own LMCache (``local_cpu``): the
path #4463 names, which B's loads from the remote would not take first.

The block-boundary stage (``Boundaries``, vLLM #51094's condition, native only): prompts
one short of, at and one past whole offload blocks, cold on A, pushed off A's GPU cache
(the gate's eviction), then asked again on A: every hit from A's own CPU tier, the
external counter token for token the cached tokens, each prompt's cached tokens whole
blocks of all but its last token (``native_offload.boundary_cached``, not the shareable
prefix); a hit in A's GPU cache means the eviction did not take.

The sensitivity gate (``service.sensitivity``) needs a step of B that loads KV, and zeroes
a chunk of that load: on the shared pool B's cross step, straight after A's cold one. On
``native`` nothing crosses, so B loads the controls from its own CPU tier: B's cross step
fills it (a cold request), prompts of their own namespaces then push the controls off
B's GPU cache (as many tokens as the record's GPU blocks hold, and a pass more), and B's
receiver-local step is the gated one; its answers are judged against A's cold ones as the
cross step's are elsewhere (``GateSteps``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pytest_sharedkv.config.stack_choice import INPROCESS, MP, NATIVE, Stack
from pytest_sharedkv.stack.launch.inprocess_connector import NO_AUDIT
from pytest_sharedkv.stack.steps import STEPS, Step

LOCAL, EXTERNAL = "local", "external"  # vllm:prefix_cache_hits, vllm:external_prefix_cache_hits
LEAK, FROM_NOWHERE = "isolation", "hits"  # the kind of a hit where none may come


@dataclass(frozen=True)
class StepHits:
    """What one step may hit. SOURCES: the counters its hits may come through (none: it
    hits nothing; a hit is of kind STRAY). WHERE: those sources in words. FULL: its
    responses' cached tokens must equal the shareable prefix. EXACT_COUNTER: the counter
    that must equal the cached tokens, token for token (None: the counters are summed as
    the module says). MAY_STOP_SHORT: the one server's L1 eviction may leave it short.
    SETTLE: it reads what an earlier step stored asynchronously, so the runner settles
    first. SPLIT: whether its counters are judged against each other at all (a step the
    table does not name is judged on its sum alone)."""

    sources: tuple[str, ...]
    where: str = ""
    full: bool = False
    exact_counter: str | None = None
    stray: str = LEAK
    may_stop_short: bool = False
    settle: bool = False
    split: bool = True
    # why its own prefix cache cannot serve where SOURCES leave it out ({replica}: its own)
    no_local: str = "before {replica} ever saw these prompts"
    # what the external counter counts where SOURCES hold both (the rest is local)
    external_is: str = "its own CPU tier"


@dataclass(frozen=True)
class GateSteps:
    """The sensitivity gate's steps on a stack: REFERENCE (the control answers the gated
    ones are judged against), FILL (steps run before, unarmed, that put the controls where
    the gated step loads them from), EVICT (whether the controls must then be pushed off
    the gated replica's GPU cache by other prompts, so its load comes from the CPU tier),
    GATED (the step run while the control file names the zeroed chunk)."""

    reference: str = "cold"
    fill: tuple[str, ...] = ()
    evict: bool = False
    gated: str = "cross"


@dataclass(frozen=True)
class Twins:
    """The identical-requests check on a stack: STEP (the replica the K identical requests
    go to at once, after one cold request on A stored the prompt's KV) and HITS (what each
    of them may hit)."""

    step: Step
    hits: StepHits


@dataclass(frozen=True)
class Boundaries:
    """The block-boundary stage on a stack: STEP (the replica the prompts are asked again
    on, after their cold step there and the eviction) and HITS (what that step may hit;
    its full hit is ``native_offload.boundary_cached``, not the shareable prefix)."""

    step: Step
    hits: StepHits


BOUNDARIES_NATIVE = Boundaries(
    Step("reload", "A", "external"),
    StepHits((EXTERNAL,), "its own CPU tier (the prompts pushed off its GPU cache)",
             full=True, exact_counter=EXTERNAL, settle=True,
             no_local="after the stage pushed these prompts off its GPU cache (the "
                      "eviction did not take, so the CPU tier was not read)"))


TWINS_SHARED = Twins(Step("identical", "B", "external"),
                     StepHits((LOCAL, EXTERNAL), "the pool (or, scheduled after an identical "
                              "request, its own prefix cache)", full=True, settle=True))


@dataclass(frozen=True)
class StackHits:
    """One stack's expectations: each step's (by name), whether its replicas share KV
    (a session turn on a replica that served none of its session's earlier turns can hit
    only what the other replica shared), the sensitivity gate's steps and the
    identical-requests check's, and the block-boundary stage's (None: the stack has no
    offload block; ``NOT_APPLICABLE`` says why)."""

    stack: str
    steps: Mapping[str, StepHits]
    shared: bool
    gate: GateSteps = GateSteps()
    twins: Twins = TWINS_SHARED
    boundaries: Boundaries | None = None

    def step(self, step: Step) -> StepHits:
        """STEP's expectation; a step the table does not name (a cell's own) is judged as
        the table's step of the same kind of hit."""
        found = self.steps.get(step.name)
        if found is not None:
            return found
        return self.steps[next(s.name for s in STEPS if s.hits == step.hits)]

    def totals(self, name: str) -> StepHits:
        """The expectation of a step's counter totals; a step the table does not name (a
        cell's own) is judged on its sum alone, not its split."""
        return self.steps.get(name, UNNAMED)


UNNAMED = StepHits((LOCAL, EXTERNAL), full=True, split=False)


def past_gpu(hits: StepHits) -> StepHits:
    """HITS of a step that may hit only its own prefix cache, where its size group's KV is
    more than the replica's GPU KV cache holds (``service.gpu_fit``): that cache evicted
    the group before the step asked again, so the pool may serve it, or part of it, in any
    mix; together still the whole shareable prefix, the external counter no more than the
    cached tokens and the rest in the local counter. A step of other sources is HITS."""
    if hits.sources != (LOCAL,):
        return hits
    return replace(hits, sources=(LOCAL, EXTERNAL),
                   where=f"{hits.where} and the pool (its GPU KV cache too small to keep "
                         "the group)", external_is="the pool")

SHARED_POOL = {
    "cold": StepHits(()),
    "local": StepHits((LOCAL,), "its own prefix cache", full=True),
    "cross": StepHits((EXTERNAL,), "the pool", full=True, exact_counter=EXTERNAL,
                      may_stop_short=True, settle=True),
    "receiver-local": StepHits((LOCAL,), "its own prefix cache", full=True),
}
OWN_CPU_TIER = {
    "cold": StepHits(()),
    "local": StepHits((LOCAL, EXTERNAL), "its own prefix cache and CPU tier", full=True,
                      settle=True),
    "cross": StepHits((), stray=FROM_NOWHERE),
    "receiver-local": StepHits((LOCAL, EXTERNAL), "its own prefix cache and CPU tier",
                               full=True, settle=True),
}
PREFIX_CACHE_OFF = "with vLLM's prefix caching off (--no-enable-prefix-caching)"
LMCACHE_ONLY = {
    "cold": StepHits(()),
    "local": StepHits((EXTERNAL,), "its own LMCache (local_cpu; the GPU prefix cache off)",
                      full=True, exact_counter=EXTERNAL, settle=True, no_local=PREFIX_CACHE_OFF),
    "cross": StepHits((EXTERNAL,), "the pool", full=True, exact_counter=EXTERNAL,
                      may_stop_short=True, settle=True, no_local=PREFIX_CACHE_OFF),
    "receiver-local": StepHits((EXTERNAL,), "its own LMCache (local_cpu, or the pool behind "
                               "it; the GPU prefix cache off)", full=True,
                               exact_counter=EXTERNAL, settle=True, no_local=PREFIX_CACHE_OFF),
}
STACK_HITS = {MP: StackHits(MP, SHARED_POOL, shared=True),
              INPROCESS: StackHits(INPROCESS, SHARED_POOL, shared=True),
              NATIVE: StackHits(NATIVE, OWN_CPU_TIER, shared=False,
                                gate=GateSteps(fill=("cross",), evict=True,
                                               gated="receiver-local"),
                                twins=Twins(Step("identical", "A", "local"),
                                            OWN_CPU_TIER["local"]),
                                boundaries=BOUNDARIES_NATIVE)}
OWN_LMCACHE = {**LMCACHE_ONLY, "cross": OWN_CPU_TIER["cross"]}  # no remote, no prefix cache
TWINS_ON_A = Step("identical", "A", "local")
# the in-process stack by (prefix caching, remote): a KeyError for another stack
INPROCESS_HITS = {
    (True, True): STACK_HITS[INPROCESS],
    (False, True): StackHits(INPROCESS, LMCACHE_ONLY, shared=True,
                             twins=Twins(TWINS_ON_A, LMCACHE_ONLY["local"])),
    (True, False): StackHits(INPROCESS, OWN_CPU_TIER, shared=False,
                             twins=Twins(TWINS_ON_A, OWN_CPU_TIER["local"])),
    (False, False): StackHits(INPROCESS, OWN_LMCACHE, shared=False,
                              twins=Twins(TWINS_ON_A, OWN_LMCACHE["local"])),
}


def expected_hits(stack: Stack | str | None, prefix_caching: bool = True,
                  remote: bool = True) -> StackHits:
    """STACK's expectations (None: a pair whose launch names no stack, the MP server's);
    PREFIX_CACHING False: with vLLM's GPU prefix cache off; REMOTE False: the in-process
    stack's replicas share no remote (a KeyError for another stack run either way)."""
    stack = Stack(stack) if stack else MP  # a launch record's text, parsed once
    if prefix_caching and remote:
        return STACK_HITS[stack]
    if stack is not INPROCESS:
        raise KeyError(f"no expected hits for {stack or MP} without "
                       + ("prefix caching" if not prefix_caching else "a remote"))
    return INPROCESS_HITS[(prefix_caching, remote)]


def stack_of(record_stack: Mapping[str, Any] | None) -> str:
    """The stack a launch record's ``stack`` names (none: the MP server's)."""
    return str((record_stack or {}).get("stack") or MP)


def prefix_caching_of(record_stack: Mapping[str, Any] | None) -> bool:
    """Whether a launch record's ``stack`` ran vLLM's GPU prefix cache (none said: on, as
    every launch but ``--no-sharedkv-inprocess-prefix-caching`` runs it)."""
    return (record_stack or {}).get("prefix_caching") is not False


def remote_of(record_stack: Mapping[str, Any] | None) -> bool:
    """Whether a launch record's ``stack`` shares KV through a remote, where it names one:
    false only where it says ``remote_url`` None (the in-process stack with
    ``--sharedkv-inprocess-remote none``)."""
    record = record_stack or {}
    return "remote_url" not in record or record["remote_url"] is not None


# what the service tier cannot judge on a stack, and why: check -> stack -> reason
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "kv_audit": {NATIVE: (
        "n/a on --sharedkv-stack native: the KV audit compares what B loaded from the pool "
        "with what A stored, and its hook sits in LMCache's connector; vLLM's native "
        "offload runs no LMCache and moves nothing between the replicas (each reloads only "
        "its own CPU tier)"),
        INPROCESS: f"n/a on --sharedkv-stack inprocess: {NO_AUDIT}"},
    "triage": {NATIVE: (
        "n/a on --sharedkv-stack native: the triage's controls (the sync hook, the other "
        "allocator, the stream remedies) act on LMCache's MP server, which this stack does "
        "not run")},
    "fault_catalogue": {NATIVE: (
        "n/a on --sharedkv-stack native: the catalogue's faults are injected into LMCache's "
        "MP server transfer, which this stack does not run")},
    "l2": {NATIVE: (
        "n/a on --sharedkv-stack native: the L2 cells need the hosts topology (an LMCache "
        "MP server per replica sharing an L2), and this stack runs no LMCache")},
    "boundaries": {stack: (
        f"n/a on --sharedkv-stack {stack}: the block-boundary stage (vLLM #51094) reloads "
        "prompts at whole offload blocks from vLLM's own CPU tier (the OffloadingConnector, "
        "--sharedkv-stack native); this stack's KV leaves the GPU through LMCache, not "
        "that connector") for stack in (MP, INPROCESS)},
}


def not_applicable(check: str, stack: str) -> str | None:
    """Why the service tier's CHECK cannot run on STACK, or None."""
    return NOT_APPLICABLE[check].get(stack)
