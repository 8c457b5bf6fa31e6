"""The sensitivity gate on the other stacks: on LMCache's in-process connector a hook in
replica B's own LMCache zeroes the named chunks before its GPU connector's
``batched_to_gpu`` copies them (chunk = start over the chunk size), armed through
``sitecustomize`` and read back by the gate as the server's hook is; on vLLM's native
offload a hook in replica B's vLLM zeroes the chunk's GPU blocks of B's CPU-tier loads
(``native_gate_hook``; its own tests in ``test_native_gate_hook.py``), and the stub
double models it on B; a stack whose record says it has no gate is unproven for that
reason and a clean pass says so."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.engine_hooks import corrupt_hook
from pytest_sharedkv.engine_hooks import inprocess_gate_hook as hook
from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe, config_dict
from pytest_sharedkv.stack.launch import stacks as stack_launch
from pytest_sharedkv.stack.launch.providers import build_vllm_pair
from pytest_sharedkv.stack.launch.spec import INJECT_DIR, gate_paths
from tests.test_stacks_wiring import cases, spec_for

CONNECTORS = """
class GPUConnectorInterface:
    pass
class VLLMPagedMemGPUConnectorV2(GPUConnectorInterface):
    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        return [bytes(o.raw_data)[:2] for o in memory_objs]
class VLLMPagedMemGPUConnectorV3(GPUConnectorInterface):
    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        return "v3"
"""
RETRIEVE = """
from lmcache.v1.gpu_connector.gpu_connectors import VLLMPagedMemGPUConnectorV2 as V2
class View:  # a slice of the raw bytes, as a tensor's
    def __init__(self, raw, cut): self.raw, self.cut = raw, cut
    def zero_(self): self.raw.b[self.cut] = bytes(len(self.raw.b[self.cut]))
class Raw:
    def __init__(self): self.b = bytearray(b"\\x07" * 8)
    def __getitem__(self, cut): return View(self, cut)
    def zero_(self): View(self, slice(None)).zero_()
    def __bytes__(self): return bytes(self.b)
class Obj:
    def __init__(self): self.raw_data = Raw()
    def get_size(self): return 4
print(V2().batched_to_gpu([Obj(), Obj(), Obj()], [32, 64, 96], [64, 96, 112], kvcaches=None))
"""


def run_replica(tmp_path: Path, chunks: list[int] | None, chunk_size: str = "32"
                ) -> tuple[str, Path]:
    """A fake LMCache engine's retrieve in a child armed as a launched replica B is
    (the hooks' directory first on its path); CHUNKS None: no control file."""
    pkg = tmp_path / "site" / "lmcache" / "v1" / "gpu_connector"
    pkg.mkdir(parents=True)
    for init in (pkg.parent.parent, pkg.parent, pkg):
        (init / "__init__.py").write_text("")
    (pkg / "gpu_connectors.py").write_text(CONNECTORS)
    control, log = gate_paths(tmp_path)
    if chunks is not None:
        control.write_text(json.dumps({"zero_chunks": chunks}))
    env = {**os.environ, hook.CONTROL_ENV: str(control), hook.LOG_ENV: str(log),
           hook.CHUNK_ENV: chunk_size,
           "PYTHONPATH": os.pathsep.join([str(INJECT_DIR), str(tmp_path / "site")])}
    done = subprocess.run([sys.executable, "-c", RETRIEVE], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), log


def test_replica_b_zeroes_the_named_chunk_of_a_retrieve(tmp_path: Path) -> None:
    out, log = run_replica(tmp_path, [1])
    # vLLM held chunk 0 already: the first object retrieved starts at 32, chunk 1
    assert out == r"[b'\x00\x00', b'\x07\x07', b'\x07\x07']"
    assert corrupt_hook.read_log(log) == [(0, 1, 4)]
    assert corrupt_hook.armed_path(log).exists()
    assert corrupt_hook.read_wrapped(log) == [
        f"{hook.MODULE}:{name}.batched_to_gpu" for name in hook.CLASSES]


def test_no_control_file_zeroes_nothing_and_no_chunk_size_arms_nothing(
        tmp_path: Path) -> None:
    out, log = run_replica(tmp_path / "off", None)
    assert out == r"[b'\x07\x07', b'\x07\x07', b'\x07\x07']" and not log.exists()
    out, log = run_replica(tmp_path / "unarmed", [1], chunk_size="")
    assert "\\x00" not in out and not corrupt_hook.armed_path(log).exists()  # gate: VOID


def test_lmcache_056_keeps_the_wrapped_method_where_the_hook_looks() -> None:
    """The installed LMCache's source, not imported: both connector classes define
    batched_to_gpu(self, memory_objs, starts, ends, ...) and the engine's retrieve calls it."""
    spec = importlib.util.find_spec("lmcache")
    if spec is None or spec.origin is None:
        pytest.skip("LMCache is not installed")
    root = Path(spec.origin).parent / "v1"
    tree = ast.parse((root / "gpu_connector" / "gpu_connectors.py").read_text())
    args = {node.name: [a.arg for a in item.args.args]
            for node in tree.body if isinstance(node, ast.ClassDef)
            for item in node.body
            if isinstance(item, ast.FunctionDef) and item.name == hook.METHOD}
    for name in hook.CLASSES:
        assert args[name][:4] == ["self", "memory_objs", "starts", "ends"]
    assert "self.gpu_connector.batched_to_gpu(" in (root / "cache_engine.py").read_text()


@pytest.mark.parametrize("gate", [True, False])
def test_the_inprocess_stack_arms_replica_b_for_the_gate(tmp_path: Path, gate: bool) -> None:
    from dataclasses import replace

    spec = replace(spec_for(tmp_path, config_dict(AttentionCopyRecipe())), gate=gate)
    stacked = stack_launch.stacked_spec(spec, "inprocess", cases({"3k": (4, 3009)}), 8)
    record = build_vllm_pair(stacked, []).record
    env = {p.name: dict(p.env) for p in record.processes}
    assert hook.CONTROL_ENV not in env["vllm replica A"]
    control, log = gate_paths(spec.log_dir)
    if gate:
        b = env["vllm replica B"]
        assert (b[hook.CONTROL_ENV], b[hook.LOG_ENV], b[hook.CHUNK_ENV]) == (
            str(control), str(log), "32")
        assert b["PYTHONPATH"].split(os.pathsep)[0] == str(INJECT_DIR)
        assert (record.paths.gate_control, record.paths.gate_log) == (control, log)
    else:
        assert hook.CONTROL_ENV not in env["vllm replica B"]
        assert record.paths.gate_control is None
    assert record.stack is not None and record.stack.get("gate") != "none"


@pytest.mark.parametrize("gate", [True, False])
def test_the_native_stack_arms_replica_b_for_the_gate(tmp_path: Path, gate: bool) -> None:
    from dataclasses import replace

    from pytest_sharedkv.engine_hooks import native_gate_hook as native

    spec = replace(spec_for(tmp_path, config_dict(AttentionCopyRecipe())), gate=gate)
    stacked = stack_launch.stacked_spec(spec, "native", cases({"3k": (200, 3009)}), 8)
    assert stacked.gate is False  # B's hook, not a server's
    record = build_vllm_pair(stacked, []).record
    env = {p.name: dict(p.env) for p in record.processes}
    assert native.CONTROL_ENV not in env["vllm replica A"]
    control, log = gate_paths(spec.log_dir)
    assert record.stack is not None and record.stack.get("gate") != "none"
    if gate:
        b = env["vllm replica B"]
        assert (b[native.CONTROL_ENV], b[native.LOG_ENV], b[native.CHUNK_ENV]) == (
            str(control), str(log), "32")
        assert b["PYTHONPATH"].split(os.pathsep)[0] == str(INJECT_DIR)
        assert (record.paths.gate_control, record.paths.gate_log) == (control, log)
        assert record.stack["gate"] == stack_launch.NATIVE_GATE
    else:
        assert native.CONTROL_ENV not in env["vllm replica B"]
        assert record.paths.gate_control is None and record.stack["gate"] == "off"


def test_the_native_stub_models_the_gate_on_b(tmp_path: Path) -> None:
    from pytest_sharedkv.stack.launch.providers import stub_pair
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    pair = stub_pair(stack_launch.stub_spec(LaunchSpec(log_dir=tmp_path), "native"))
    record = pair.record
    assert pair.close() == []
    control, log = gate_paths(tmp_path)
    assert (record.paths.gate_control, record.paths.gate_log) == (control, log)
    assert record.stack is not None and "no_gate" not in record.stack
    b = next(p for p in record.processes if p.name == "stub replica B")
    assert ("--corrupt-control", str(control)) == b.argv[b.argv.index("--corrupt-control"):][:2]


class Runner:
    class cases:  # the runner's attribute, as a class
        @staticmethod
        def by_role(role: str) -> list[Any]:
            return []


def test_a_stack_without_a_gate_is_unproven_for_its_recorded_reason() -> None:
    from pytest_sharedkv.service.sensitivity import UNPROVEN, run_gate

    why = {"gate": "none", "no_gate": "no KV crosses between the replicas"}
    result = run_gate(Runner(), None, None, why)  # type: ignore[arg-type]
    assert (result.status, result.message) == (
        UNPROVEN, "sensitivity unproven: no KV crosses between the replicas")


def test_a_clean_pass_under_an_unproven_gate_says_so() -> None:
    from pytest_sharedkv.report.records import Check
    from pytest_sharedkv.service import summary

    key = {"provider": "vllm", "allocator": "native offloading", "delay": "0"}
    tier = "service_regression"
    checks = [Check(tier, {**key, "size": "gate", "step": "zeroed chunk"}, 0, 0,
                    message="sensitivity unproven: no KV crosses", kind="gate",
                    status="unproven")]
    checks += [Check(tier, {**key, "size": "3k", "step": step}, 2, 2, kind="hits")
               for step in ("cold", "local", "cross", "receiver-local")]
    lines = summary.verdicts(checks)
    assert lines[0].startswith("NOTE ")
    assert lines[1].endswith("hits as expected; sensitivity unproven, so no proof of integrity")
