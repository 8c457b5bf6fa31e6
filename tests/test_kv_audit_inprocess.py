"""The KV audit on the in-process stack: n/a, said before the run, never VOID after it. The
audit's hook wraps LMCache's MP connector, and the in-process connector (LMCacheConnectorV1)
registers its KV caches through its own adapter, so the hook never sees them (the H200 run
of vLLM 0.26.0 with LMCache 0.5.6: "the audit hook never saw replica A or B register its
KV caches"). Read from the installed LMCache's source, not imported; the launch is not
armed for it and its record says why; the tier's test skips with the same words."""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_sharedkv.engine_hooks import kv_audit_hook
from pytest_sharedkv.engine_hooks.switches import arms_a_hook
from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe, config_dict
from pytest_sharedkv.service.expected_hits import NOT_APPLICABLE, not_applicable
from pytest_sharedkv.stack.launch import inprocess_connector
from pytest_sharedkv.stack.launch import stacks as stack_launch
from pytest_sharedkv.stack.launch.providers import build_vllm_pair
from pytest_sharedkv.stack.launch.spec import LaunchSpec
from tests.test_stacks_wiring import cases, spec_for

WHY = NOT_APPLICABLE["kv_audit"]["inprocess"]


def _methods(path: Path) -> dict[str, set[str]]:
    """class -> the methods it defines, in the module at PATH."""
    tree = ast.parse(path.read_text())
    return {node.name: {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            for node in tree.body if isinstance(node, ast.ClassDef)}


def test_the_reason_names_what_the_hook_wraps_and_where_the_stack_registers() -> None:
    assert not_applicable("kv_audit", "inprocess") == WHY
    assert WHY.startswith("n/a on --sharedkv-stack inprocess: ")
    assert ("lmcache.integration.vllm.lmcache_mp_connector:"
            "LMCacheMPConnector.register_kv_caches") in WHY
    assert ("LMCacheConnectorV1 registers its KV caches through "
            "lmcache.integration.vllm.vllm_v1_adapter:LMCacheConnectorV1Impl."
            "register_kv_caches") in WHY
    assert "the audit does not carry over to this stack" in WHY
    assert not_applicable("kv_audit", "mp") is None  # the MP stack keeps its audit


def test_lmcache_056_registers_in_process_kv_caches_where_the_hook_does_not_look() -> None:
    """The installed LMCache's source: the hook's method is the MP connector's; the
    in-process connector hands vLLM's KV caches to LMCacheConnectorV1Impl, a class of its
    own adapter that never names the MP connector, and lacks the MP adapter's page
    layout the audit's digests read (``ADAPTER_NEEDS``), so wrapping it would not be the
    same audit."""
    spec = importlib.util.find_spec("lmcache")
    if spec is None or spec.origin is None:
        pytest.skip("LMCache is not installed")
    root = Path(spec.origin).parent / "integration" / "vllm"
    module, method = kv_audit_hook.REGISTRATION.split(":")
    cls, name = method.split(".")
    assert name in _methods(root / f"{module.rsplit('.', 1)[1]}.py")[cls]
    module, method = inprocess_connector.REGISTRATION.split(":")
    cls, name = method.split(".")
    adapter = root / f"{module.rsplit('.', 1)[1]}.py"
    assert name in _methods(adapter)[cls]
    text = adapter.read_text()
    assert "LMCacheMPConnector" not in text and "lmcache_mp_connector" not in text
    assert not [need for need in kv_audit_hook.ADAPTER_NEEDS[1:] if need in text]
    connector = (root / "lmcache_connector_v1.py").read_text()
    assert f"self._lmcache_engine = {cls}(" in connector
    assert f"self._lmcache_engine.{name}(kv_caches)" in connector


def test_the_inprocess_launch_is_not_armed_for_the_audit_and_its_record_says_why(
        tmp_path: Path) -> None:
    spec = replace(spec_for(tmp_path, config_dict(AttentionCopyRecipe())), kv_audit=True)
    stacked = stack_launch.stacked_spec(spec, "inprocess", cases({"3k": (4, 3009)}), 8)
    assert not stacked.kv_audit
    record = build_vllm_pair(stacked, []).record
    for process in record.processes:
        assert kv_audit_hook.DIR_ENV not in dict(process.env), process.name
    assert record.paths.kv_audit_dir is None
    assert record.stack is not None
    assert record.stack["kv_audit"] == f"n/a: {inprocess_connector.NO_AUDIT}"
    assert WHY.endswith(inprocess_connector.NO_AUDIT)
    # the MP stack is armed as before
    mp = build_vllm_pair(replace(spec, log_dir=tmp_path / "mp"), []).record
    assert mp.paths.kv_audit_dir is not None
    assert any(kv_audit_hook.DIR_ENV in dict(p.env) for p in mp.processes)
    assert arms_a_hook([(kv_audit_hook.DIR_ENV, "x")])


def test_the_stub_models_the_inprocess_stack_without_the_audit(tmp_path: Path) -> None:
    spec = stack_launch.stub_spec(LaunchSpec(log_dir=tmp_path, kv_audit=True), "inprocess")
    assert not spec.kv_audit and spec.stack is not None
    assert spec.stack.record["kv_audit"] == f"n/a: {inprocess_connector.NO_AUDIT}"
    native = stack_launch.stub_spec(LaunchSpec(log_dir=tmp_path, kv_audit=True), "native")
    assert native.kv_audit and "kv_audit" not in (native.stack.record if native.stack else {})


def test_the_tier_skips_the_audit_on_the_inprocess_stub_saying_why(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped suite on the stub's model of the in-process stack: test_kv_audit is
    skipped with the n/a reason (not failed VOID), and the report's stack fact says it."""
    from pytest_sharedkv.config.options import MEASURED_ENV

    monkeypatch.setenv(MEASURED_ENV, "1")
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_sharedkv.suites", "-m", "service_regression",
        "-p", "no:cacheprovider", "--sharedkv-provider=stub", "--sharedkv-settle-s=0.05",
        "--sharedkv-service-sizes=3k", "--sharedkv-json=r.json",
        "--sharedkv-stack=inprocess", "-k", "kv_audit")
    result.assert_outcomes(skipped=1)
    report = json.loads((pytester.path / "r.json").read_text())
    [test] = [t for t in report["tests"] if "test_kv_audit" in t["nodeid"]]
    assert (test["outcome"], test["message"]) == ("skipped", WHY)
    assert not [c for c in report["checks"] if c["kind"] == "audit-mismatch"]
    stack = next(json.loads(f["value"]) for f in report["facts"] if f["name"] == "stack")
    assert stack["kv_audit"] == f"n/a: {inprocess_connector.NO_AUDIT}"
    assert "KV AUDIT" not in result.stdout.str()
