"""Planning a launch: the one place that chooses how a pair comes to exist.

``plan_launch`` turns the run's settings and what a pair's slot knows (the provider, the
allocator x delay cell, the corpus, the model, the lease's devices and environment) into a
``LaunchPlan``: the ``LaunchSpec`` the chosen provider and stack launch with, nothing
started. ``LaunchPlan.start`` launches it; ``LaunchPlan.built`` builds the pair it would
launch (each replica's argv and environment, the launch record) without starting a
process, which is what the self-tests read. Providers and stacks are chosen through
typed tables keyed by the ``Provider``, ``Engine`` and ``Stack`` enums (``START``,
``ENGINE_START``, ``STACK_START``), never by comparing strings; a stack's spec comes
from ``stacks.py`` and a provider never calls back into the stack choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_sharedkv.config.engine import Engine
from pytest_sharedkv.config.provider import Provider
from pytest_sharedkv.config.stack_choice import Stack
from pytest_sharedkv.stack.faults import StubFaults
from pytest_sharedkv.stack.launch.spec import LaunchSpec

if TYPE_CHECKING:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.host.leases import Lease
    from pytest_sharedkv.stack.pair import ReplicaPair
    from pytest_sharedkv.stack.topology import HostsSpec

Edit = Callable[[LaunchSpec], LaunchSpec]


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch will start: PROVIDER's pair on STACK from SPEC (None: external
    endpoints, which the suite never starts; ENDPOINTS are theirs)."""

    provider: Provider
    stack: Stack = Stack.MP
    spec: LaunchSpec | None = None
    endpoints: tuple[str, ...] = field(default=())
    serving: Engine = Engine.VLLM

    def start(self) -> ReplicaPair:
        """The pair, started (a launch that fails part way stops what it had started)."""
        return START[self.provider](self)

    def built(self) -> ReplicaPair:
        """The pair this plan launches, built but not started: each replica's argv and
        environment and the launch record (a launched pair's LMCache server is neither
        started nor recorded). Only a launched vLLM pair is built without starting."""
        from pytest_sharedkv.stack.launch.providers import build_vllm_pair

        if self.provider is not Provider.VLLM or self.spec is None:
            raise ValueError(f"only a launched vllm pair is built without a start, not "
                             f"{self.provider}")
        return build_vllm_pair(self.spec)


def _external(plan: LaunchPlan) -> ReplicaPair:
    from pytest_sharedkv.stack.launch import providers

    return providers.external_pair(plan.endpoints)


def _stub(plan: LaunchPlan) -> ReplicaPair:
    from pytest_sharedkv.stack.launch import providers

    assert plan.spec is not None
    return providers.stub_pair(plan.spec)


def _vllm(plan: LaunchPlan) -> ReplicaPair:
    assert plan.spec is not None
    return ENGINE_START[plan.serving](plan)


def _vllm_engines(plan: LaunchPlan) -> ReplicaPair:
    assert plan.spec is not None
    return STACK_START[plan.stack](plan.spec)


def _sglang_engines(plan: LaunchPlan) -> ReplicaPair:
    from pytest_sharedkv.stack.launch.sglang_engine import launch_sglang_pair

    assert plan.spec is not None
    return launch_sglang_pair(plan.spec)


def _mp(spec: LaunchSpec) -> ReplicaPair:
    from pytest_sharedkv.stack.launch import providers

    return providers.launch_vllm_pair(spec)


def _stacked(spec: LaunchSpec) -> ReplicaPair:
    from pytest_sharedkv.stack.launch.stacks import launch_stack_pair

    return launch_stack_pair(spec)


# how each provider's pair starts, and on a launched vLLM pair each stack's
START: dict[Provider, Callable[[LaunchPlan], ReplicaPair]] = {
    Provider.EXTERNAL: _external, Provider.STUB: _stub, Provider.VLLM: _vllm}
# the engine in each launched replica (--sharedkv-engine): SGLang runs over the MP server
ENGINE_START: dict[Engine, Callable[[LaunchPlan], ReplicaPair]] = {
    Engine.VLLM: _vllm_engines, Engine.SGLANG: _sglang_engines}
STACK_START: dict[Stack, Callable[[LaunchSpec], ReplicaPair]] = {
    Stack.MP: _mp, Stack.INPROCESS: _stacked, Stack.NATIVE: _stacked}


def plan_launch(settings: Settings, provider: Provider, *, log_dir: Path | None = None,
                cases: CaseSet | None = None, model: Path | None = None,
                allocator: str = "mixed", delay: int = 0,
                stub_faults: StubFaults | None = None, hosts: HostsSpec | None = None,
                lease: Lease | None = None, edit: Edit | None = None) -> LaunchPlan:
    """The launch SETTINGS ask of PROVIDER (never ``auto``: resolve it first) for one
    (ALLOCATOR, DELAY) cell: the stub double modelling the stack asked for, a launched
    vLLM pair on LEASE's devices with the lease's environment (its device order) in the
    server and both replicas, never the run's own (the stack's spec from ``stacks.py``:
    ``StackUnavailable`` where it cannot run), or the external endpoints. EDIT changes
    the spec before the launch (a triage control, a catalogue fault). Nothing is
    started."""
    from pytest_sharedkv.corpus.cases import longest_prompt
    from pytest_sharedkv.stack.engine_settings import EngineSettings
    from pytest_sharedkv.stack.launch.spec import max_model_len

    if provider not in START:
        raise ValueError(f"no launch for provider {provider}: resolve it first")
    stack, serving = settings.stack, settings.engine
    if provider is Provider.EXTERNAL:
        return LaunchPlan(provider, endpoints=settings.endpoints or ())
    if cases is None or log_dir is None:
        raise ValueError(f"a {provider} launch needs the corpus and a log directory")
    engine = EngineSettings(extra_args=settings.vllm_args)
    # SGLang's connector has no audit hook: its pair (and the stub's model of it) runs
    # none, and the service tier says n/a (sglang_dialect.KV_AUDIT)
    audit = settings.kv_audit and serving is Engine.VLLM
    l1 = settings.l1_gib if settings.l1_gib is not None else LaunchSpec.l1_size_gb
    counts = hosts is not None or settings.l1_gib is not None  # evictions in the report
    if provider is Provider.STUB:
        spec = LaunchSpec(log_dir=log_dir, chunk_size=cases.chunk or 32,
                          kv_audit=audit, engine=engine, gate=settings.gate,
                          stub_faults=stub_faults or StubFaults(), hosts=hosts,
                          count_evictions=counts, l1_size_gb=l1, serving=serving)
        if stack is not Stack.MP:  # the double models the stack, and says so
            from pytest_sharedkv.stack.launch.stacks import inprocess_tiers, stub_spec

            spec = stub_spec(spec, stack, settings.native_connector, inprocess_tiers(settings))
        return LaunchPlan(provider, stack, edit(spec) if edit is not None else spec,
                          serving=serving)
    if model is None:
        raise ValueError("a launched vllm pair needs a model")
    from pytest_sharedkv.layouts.chunk_size import derive_chunk_size

    devices: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    if lease is not None:
        leased = lease.env()
        devices = tuple(leased.pop("CUDA_VISIBLE_DEVICES").split(","))  # one each, or one
        env = tuple(leased.items())
    spec = LaunchSpec(
        log_dir=log_dir, allocator=allocator, model=model, devices=devices,
        server_env=env, replica_env=env, inject_delay_cycles=delay,
        max_model_len=max_model_len(longest_prompt(cases), cases.answer_tokens, model),
        chunk_size=settings.chunk_size or derive_chunk_size(model),
        kv_audit=audit, engine=engine, hosts=hosts, count_evictions=counts,
        l1_size_gb=l1, gate=settings.gate, serving=serving)
    if edit is not None:
        spec = edit(spec)
    if serving is Engine.VLLM and stack is not Stack.MP:  # --sharedkv-stack inprocess|native
        from pytest_sharedkv.stack.launch.stacks import inprocess_tiers, stacked_spec

        spec = stacked_spec(spec, stack, cases, settings.concurrency,
                            inprocess_tiers(settings), settings.native_connector)
    return LaunchPlan(provider, stack, spec, serving=serving)
