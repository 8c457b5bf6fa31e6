"""Planning a launch (``stack.launch.plan``), the public face the self-tests read a launch
through: the provider and the stack chosen from typed tables, the spec each gets, and the
pair a plan builds without starting a process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.config.provider import Provider
from pytest_sharedkv.config.stack_choice import Stack
from pytest_sharedkv.corpus.cases import CaseSet
from pytest_sharedkv.stack.launch import plan as launch_plan
from pytest_sharedkv.stack.launch.plan import START, LaunchPlan, plan_launch
from pytest_sharedkv.stack.launch.spec import LaunchSpec


def test_external_endpoints_plan_no_spec() -> None:
    plan = plan_launch(Settings(endpoints=("http://a:1", "http://b:2")), Provider.EXTERNAL)
    assert plan.spec is None and plan.endpoints == ("http://a:1", "http://b:2")


def test_every_provider_that_serves_a_pair_has_a_start_and_no_other() -> None:
    assert set(START) == {Provider.EXTERNAL, Provider.STUB, Provider.VLLM}
    for unresolved in (Provider.AUTO, Provider.TRANSFER):
        with pytest.raises(ValueError, match="resolve it first"):
            plan_launch(Settings(), unresolved)


@pytest.mark.parametrize(("stack", "arm"), [(Stack.MP, "ON"), (Stack.INPROCESS, "ON"),
                                            (Stack.NATIVE, "NATIVE")])
def test_the_stub_models_the_stack_asked_for(tmp_path: Path, stack: Stack, arm: str) -> None:
    plan = plan_launch(Settings(stack=stack), Provider.STUB, log_dir=tmp_path,
                       cases=CaseSet("copy", 32))
    assert plan.spec is not None and plan.spec.arm == arm and plan.stack is stack
    assert (plan.spec.stack is None) == (stack is Stack.MP)
    if plan.spec.stack is not None:
        assert plan.spec.stack.record["stack"] == stack.value


def test_a_launched_pair_is_built_without_a_start(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    plan = plan_launch(Settings(), Provider.VLLM, log_dir=tmp_path / "logs",
                       cases=CaseSet("copy", 32), model=model, allocator="lazy", delay=7)
    assert plan.spec is not None and plan.spec.allocator == "lazy"
    assert plan.spec.inject_delay_cycles == 7
    pair = plan.built()
    assert [p.name for p in pair.record.processes] == ["vllm replica A", "vllm replica B"]
    assert str(model) in pair.record.processes[0].argv
    assert all(r.process is not None and r.process.proc is None
               for r in pair.replicas.values())  # nothing started
    with pytest.raises(ValueError, match="only a launched vllm pair"):
        LaunchPlan(Provider.STUB, spec=plan.spec).built()


@pytest.mark.parametrize(("stack", "started"), [(Stack.MP, "mp"), (Stack.INPROCESS, "stacked"),
                                                (Stack.NATIVE, "stacked")])
def test_a_launched_pair_starts_through_its_stacks_entry(tmp_path: Path, stack: Stack,
                                                         started: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from pytest_sharedkv.stack.launch import providers, stacks

    seen: list[str] = []

    def record(name: str) -> Any:
        return lambda spec: seen.append(name)

    monkeypatch.setattr(providers, "launch_vllm_pair", record("mp"))
    monkeypatch.setattr(stacks, "launch_stack_pair", record("stacked"))
    LaunchPlan(Provider.VLLM, stack, LaunchSpec(tmp_path)).start()
    assert seen == [started]
    assert launch_plan.STACK_START.keys() == set(Stack)


def test_an_sglang_pair_starts_through_the_engines_entry(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    from pytest_sharedkv.config.engine import Engine
    from pytest_sharedkv.stack.launch import providers, sglang_engine

    seen: list[str] = []
    monkeypatch.setattr(providers, "launch_vllm_pair", lambda spec: seen.append("vllm"))
    monkeypatch.setattr(sglang_engine, "launch_sglang_pair", lambda spec: seen.append("sglang"))
    LaunchPlan(Provider.VLLM, Stack.MP, LaunchSpec(tmp_path), serving=Engine.SGLANG).start()
    LaunchPlan(Provider.VLLM, Stack.MP, LaunchSpec(tmp_path)).start()
    assert seen == ["sglang", "vllm"]
    assert launch_plan.ENGINE_START.keys() == set(Engine)
