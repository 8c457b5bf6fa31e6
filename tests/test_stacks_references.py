"""Stored references keyed by the stack: '+inprocess' / '+native' after the engine key
(the MP server's key unchanged), and a run with no references of its own takes a
baseline only from its own stack."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_sharedkv.service import references
from pytest_sharedkv.stack.launch import stacks as stack_launch
from pytest_sharedkv.stack.launch.providers import stub_pair
from pytest_sharedkv.stack.launch.spec import LaunchSpec


def _pair(provider: str, stack: dict[str, Any] | None) -> Any:
    return SimpleNamespace(labels={"provider": provider}, topology=None,
                           record=SimpleNamespace(stack=stack))


def test_the_reference_key_names_the_stack() -> None:
    assert references.engine_key(_pair("stub", None), "absent") == "stub"
    assert references.engine_key(_pair("stub", {"stack": "native"}), "absent") == "stub+native"
    launched = references.engine_key(_pair("vllm", {"stack": "inprocess"}), "absent")
    assert launched.startswith("vllm-") and launched.endswith("+inprocess")
    assert references.engine_order(launched)[0] is True  # still sorts as a vLLM key
    assert references.engine_key(_pair("vllm", {"stack": "odd"}), "absent").endswith(
        "+unknown")


def test_a_native_key_names_no_lmcache_and_the_simple_connector_apart() -> None:
    native = references.engine_key(_pair("vllm", {"stack": "native",
                                                  "connector": "OffloadingConnector"}),
                                   "absent")
    simple = references.engine_key(_pair("vllm", {"stack": "native", "connector":
                                                  "SimpleCPUOffloadConnector"}), "absent")
    assert "lmcache" not in native and native.endswith("+native")
    assert simple == native + "-simple"
    assert not references.same_stack(native, simple)
    assert references.same_stack(simple, "vllm-0.25.0+native-simple")
    assert references.engine_order(native)[:2] == references.engine_order(simple)[:2]
    assert references.engine_order("vllm-0.27.0+native") > references.engine_order(native)


@pytest.mark.parametrize("stack", ["inprocess", "native"])
def test_a_launched_stack_names_itself_in_its_record(tmp_path: Path, stack: str) -> None:
    pair = stub_pair(stack_launch.stub_spec(LaunchSpec(log_dir=tmp_path), stack))
    try:
        assert references.engine_key(pair, "absent") == f"stub+{stack}"
    finally:
        assert pair.close() == []


def test_the_inprocess_record_names_its_stack(tmp_path: Path) -> None:
    from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe, config_dict
    from pytest_sharedkv.stack.launch.providers import build_vllm_pair
    from tests.test_stacks_wiring import cases, spec_for

    spec = stack_launch.stacked_spec(spec_for(tmp_path, config_dict(AttentionCopyRecipe())),
                                     "inprocess", cases({"3k": (4, 3009)}), 8)
    pair = build_vllm_pair(spec, [])
    assert references.stack_key(pair) == "+inprocess"


def test_a_baseline_is_only_of_the_same_stack(tmp_path: Path) -> None:
    for key in ("vllm-0.26.0+lmcache-0.5.6-cuda_ops", "vllm-0.25.0+lmcache-0.5.5+native",
                "vllm-0.25.0+lmcache-0.5.5+inprocess"):
        (tmp_path / "m" / key).mkdir(parents=True)
    native = references.baseline(tmp_path, "m", "vllm-0.26.0+lmcache-0.5.6-cuda_ops+native")
    assert native is not None and native.name == "vllm-0.25.0+lmcache-0.5.5+native"
    inproc = references.baseline(tmp_path, "m", "vllm-0.27.0+lmcache-0.5.6-cuda_ops+inprocess")
    assert inproc is not None and inproc.name == "vllm-0.25.0+lmcache-0.5.5+inprocess"
    mp = references.baseline(tmp_path, "m", "vllm-0.27.0+lmcache-0.5.6-cuda_ops")
    assert mp is not None and mp.name == "vllm-0.26.0+lmcache-0.5.6-cuda_ops"
    (tmp_path / "n" / "vllm-0.26.0+lmcache-0.5.6-cuda_ops").mkdir(parents=True)
    assert references.baseline(tmp_path, "n", "vllm-0.27.0+lmcache-0.5.6-cuda_ops+native") \
        is None  # the MP server's references are no baseline for native offload
