"""The sensitivity gate's hook in a replica on vLLM's native offload, against a fake of
vLLM 0.26.0's two classes it wraps (the same module paths and signatures), on CPU tensors,
in a child armed as replica B is (the hooks' directory first on its path): while the
control file names chunk K, the GPU blocks a CPU -> GPU load fills with tokens
[K * 32, (K + 1) * 32) are zeroed after the copy (the fake copy lands only when waited on,
so a hook that zeroed before waiting would see its zeros overwritten), attention groups
only, never a store nor the null block; without the control file nothing changes; a vLLM
without the targets wraps nothing and the gate is VOID naming them."""

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
from pytest_sharedkv.engine_hooks import native_gate_hook as hook
from pytest_sharedkv.service.sensitivity import PROVEN, VOID, GateResult, judge
from pytest_sharedkv.stack.launch.spec import INJECT_DIR, gate_paths

# vLLM 0.26.0's v1/kv_offload/cpu/gpu_worker.py, reduced: the CPU -> GPU copy is deferred
# to wait()/get_finished() (an asynchronous copy that lands later)
GPU_WORKER = """
class SingleDirectionOffloadingHandler:
    def __init__(self, gpu_tensors, cpu_tensors, blocks_per_chunk,
                 kv_cache_groups_data_refs, gpu_to_cpu, mmap_region=None):
        self.src_tensors = gpu_tensors if gpu_to_cpu else cpu_tensors
        self.dst_tensors = cpu_tensors if gpu_to_cpu else gpu_tensors
        self.gpu_to_cpu = gpu_to_cpu
        self.kv_cache_groups_data_refs = kv_cache_groups_data_refs
        self.pending = {}

    def transfer_async(self, job_id, src_spec, dst_spec):
        self.pending[job_id] = (list(src_spec.block_ids), list(dst_spec.block_ids))
        return True

    def wait(self, job_ids):
        for job_id in job_ids:
            src, dst = self.pending.pop(job_id, ([], []))
            for s, d in zip(src, dst):
                for i, t in enumerate(self.dst_tensors):
                    t[d] = self.src_tensors[i][s]

    def get_finished(self):
        done = list(self.pending)
        self.wait(set(done))
        return done
"""
# vLLM 0.26.0's distributed/kv_transfer/kv_connector/v1/offloading/worker.py, reduced
CONNECTOR_WORKER = """
class OffloadingConnectorWorker:
    def __init__(self, spec, kv_cache_config):
        self.spec = spec
        self.kv_cache_config = kv_cache_config
        self.worker = None
"""
SPECS = """
class KVCacheSpec:
    def __init__(self, block_size): self.block_size = block_size
class AttentionSpec(KVCacheSpec): pass
class FullAttentionSpec(AttentionSpec): pass
class MambaSpec(KVCacheSpec): pass
"""
# a load of one request, as the scheduler's update_state_after_alloc builds it: GROUPS
# (block size, kind) of the KV-cache config, DST per group (GPU ids, first block index)
LOAD = """
import json, sys, torch
from types import SimpleNamespace as NS
from vllm.v1.kv_offload.cpu.gpu_worker import SingleDirectionOffloadingHandler as H
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker as W)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
args = json.loads(sys.argv[1])
kinds = {"attention": FullAttentionSpec, "state": MambaSpec}
groups = [NS(kv_cache_spec=kinds[k](b)) for b, k in args["groups"]]
W(None, NS(kv_cache_groups=groups))
gpu = [torch.full((64, 8), 1, dtype=torch.int8) for _ in range(2)]
cpu = [torch.full((64, 8), 7, dtype=torch.int8) for _ in range(2)]
refs = [[NS(tensor_idx=i, page_size_bytes=6) for i in range(2)] for _ in groups]
ids, sizes, firsts = [], [], []
for block_ids, first in args["dst"]:
    ids += block_ids; sizes.append(len(block_ids)); firsts.append(first)
dst = NS(block_ids=ids, group_sizes=sizes, block_indices=firsts)
src = NS(block_ids=list(range(len(ids))))
handler = H(gpu, cpu, 1, refs, args.get("gpu_to_cpu", False))
handler.transfer_async(5, src, dst)
handler.get_finished()  # the copy lands (vLLM reports the load done)
out = {str(b): gpu[0][b].tolist() + gpu[1][b].tolist() for b in ids}
print(json.dumps(out))
"""


def fake_vllm(root: Path, gpu_worker: str = GPU_WORKER,
              connector_worker: str = CONNECTOR_WORKER) -> Path:
    site = root / "site"
    files = {"vllm/v1/kv_offload/cpu/gpu_worker.py": gpu_worker,
             "vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py":
                 connector_worker,
             "vllm/v1/kv_cache_interface.py": SPECS}
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for parent in path.relative_to(site).parents:
            if str(parent) != ".":
                (site / parent / "__init__.py").touch()
    return site


def run_load(tmp_path: Path, chunks: list[int] | None, load: dict[str, Any],
             site: Path | None = None) -> tuple[dict[str, list[int]], Path, str]:
    """One CPU -> GPU load in a child armed as replica B (CHUNKS None: no control file):
    each loaded GPU block's bytes afterwards, the log, the child's stderr."""
    pytest.importorskip("torch")
    site = site or fake_vllm(tmp_path)
    control, log = gate_paths(tmp_path)
    if chunks is not None:
        control.write_text(json.dumps({"zero_chunks": chunks}))
    env = {**os.environ, hook.CONTROL_ENV: str(control), hook.LOG_ENV: str(log),
           hook.CHUNK_ENV: "32", "PYTHONPATH": os.pathsep.join([str(INJECT_DIR), str(site)])}
    done = subprocess.run([sys.executable, "-c", LOAD, json.dumps(load)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), log, done.stderr


COPIED, ZEROED = [7] * 8 + [7] * 8, [0] * 6 + [7] * 2 + [0] * 6 + [7] * 2
# one 16-token attention group, blocks 90..97 of a request (tokens 1440..1567) into GPU
# blocks 10..17: chunk 47 (tokens 1504..1535) is blocks 94 and 95, GPU blocks 14 and 15
ATTENTION = {"groups": [[16, "attention"]], "dst": [[list(range(10, 18)), 90]]}


def test_the_blocks_of_the_named_chunk_are_zeroed_after_the_copy(tmp_path: Path) -> None:
    out, log, _ = run_load(tmp_path, [47], ATTENTION)
    assert {b for b, data in out.items() if data == ZEROED} == {"14", "15"}
    assert all(data == COPIED for b, data in out.items() if b not in ("14", "15"))
    # one line a zeroed block: group 0, chunk 47, the un-padded page of both tensors
    assert corrupt_hook.read_log(log) == [(0, 47, 12), (0, 47, 12)]
    assert corrupt_hook.armed_path(log).exists()
    assert corrupt_hook.read_wrapped(log) == list(hook.NEEDED)


def test_without_the_control_file_or_on_a_store_nothing_changes(tmp_path: Path) -> None:
    out, log, _ = run_load(tmp_path / "off", None, ATTENTION)
    assert all(data == COPIED for data in out.values()) and not log.exists()
    out, log, _ = run_load(tmp_path / "store", [47], {**ATTENTION, "gpu_to_cpu": True})
    assert corrupt_hook.read_log(log) == []  # a GPU -> CPU store is never zeroed


def test_a_hybrid_load_zeroes_its_attention_blocks_only_and_never_the_null_block(
        tmp_path: Path) -> None:
    # Qwen3-Next's copy model: a 16-token attention group and a Gated DeltaNet state group
    # of the same block; the state group's blocks at the chunk stay as copied, and so does
    # the null block (id 0) where it stands for one of the chunk's attention blocks
    load = {"groups": [[16, "attention"], [16, "state"]],
            "dst": [[[21, 0, 22, 23], 93], [[30, 31, 32], 93]]}
    out, log, _ = run_load(tmp_path, [47], load)
    assert {b for b, data in out.items() if data == ZEROED} == {"22"}
    assert out["0"] == COPIED and out["31"] == COPIED and out["32"] == COPIED
    assert corrupt_hook.read_log(log) == [(0, 47, 12)]


def test_a_block_larger_than_the_chunk_is_zeroed_whole_and_said(tmp_path: Path) -> None:
    load = {"groups": [[64, "attention"]], "dst": [[[3, 4], 23]]}  # tokens 1472..1599
    out, log, err = run_load(tmp_path, [47], load)
    assert out["3"] == ZEROED and out["4"] == COPIED
    assert corrupt_hook.read_log(log) == [(0, 47, 12)]
    assert "zeroed whole, beyond chunk 47" in err


def test_a_load_it_cannot_map_disables_the_hook_and_never_raises(tmp_path: Path) -> None:
    load = {"groups": [[16, "attention"]], "dst": [[[3, 4], 93], [[5], 0]]}  # 2 groups of 1
    out, log, err = run_load(tmp_path, [47], load)
    assert all(data == COPIED for data in out.values())
    assert corrupt_hook.read_log(log) == [] and "disabled: could not zero" in err


@pytest.mark.parametrize("missing", ["both", "connector"])
def test_a_vllm_without_its_targets_wraps_nothing_and_the_gate_names_them(
        tmp_path: Path, missing: str) -> None:
    renamed = GPU_WORKER.replace("def transfer_async", "def transfer_blocks")
    site = fake_vllm(tmp_path, renamed if missing == "both" else GPU_WORKER,
                     CONNECTOR_WORKER.replace("OffloadingConnectorWorker", "Elsewhere"))
    control, log = gate_paths(tmp_path)
    env = {**os.environ, hook.CONTROL_ENV: str(control), hook.LOG_ENV: str(log),
           hook.CHUNK_ENV: "32", "PYTHONPATH": os.pathsep.join([str(INJECT_DIR), str(site)])}
    subprocess.run([sys.executable, "-c", "import vllm.v1.kv_offload.cpu.gpu_worker, "
                    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker"],
                   env=env, check=True, timeout=60, cwd=tmp_path)
    wrapped = corrupt_hook.read_wrapped(log)
    assert wrapped == ([] if missing == "both" else [hook.NEEDED[0]])
    result = judge(GateResult("", "", 47, copying=4, others=4, others_exact=4,
                              zeroed_chunks_logged=0, hook_loaded=True, wrapped=wrapped),
                   [], stack="native")
    assert result.status == VOID
    assert "never zeroed a chunk in replica B's vLLM" in result.message
    if missing == "both":
        assert f"found none of its targets ({', '.join(hook.NEEDED)})" in result.message
    else:
        assert f"found no {hook.NEEDED[1]}, which it needs too" in result.message


def test_an_applied_gate_on_native_is_judged_as_on_the_other_stacks() -> None:
    result = judge(GateResult("", "", 47, copying=4, changed=4, others=4, others_exact=4,
                              zeroed_chunks_logged=8, hook_loaded=True,
                              wrapped=list(hook.NEEDED)), [], stack="native")
    assert result.status == PROVEN
    assert result.message == ("sensitivity proven: with chunk 47 zeroed in every load from "
                              "B's CPU tier, 4/4 answers that copy from it changed and 4/4 "
                              "others stayed exact")


def test_a_push_that_failed_is_named_where_the_gate_is_not_proven() -> None:
    """A push off B's GPU cache whose requests got no answer leaves the controls where the
    gated step may hit them: said beside a gate that is not proven, not beside a proof."""
    from pytest_sharedkv.service.sensitivity import Evicted

    failed = Evicted(16, ["HTTP 400: cache_salt must not contain '/'"] * 16).failed()
    assert failed == ("16 of 16 requests that were to push the prompts off the GPU cache got "
                      "no answer (first: HTTP 400: cache_salt must not contain '/')")
    assert Evicted(16).failed() is None
    short = judge(GateResult("", "", 47, copying=4, changed=2, others=4, others_exact=4,
                             zeroed_chunks_logged=2, hook_loaded=True, evict_failed=failed),
                  [], stack="native")
    assert short.status == VOID and short.message.endswith(f"; the push before the gated "
                                                           f"step: {failed}")
    proven = judge(GateResult("", "", 47, copying=4, changed=4, others=4, others_exact=4,
                              zeroed_chunks_logged=8, hook_loaded=True, evict_failed=failed),
                   [], stack="native")
    assert proven.status == PROVEN and "push" not in proven.message


def test_evictor_passes_cover_the_gpu_cache_and_one_more() -> None:
    from pytest_sharedkv.service.sensitivity import evictor_passes

    assert evictor_passes(256 * 32, 8 * 3041) == 2
    assert evictor_passes(1530 * 16, 8 * 3041) == 3
    assert evictor_passes(0, 100) == 0


def installed_vllm() -> Path:
    """The installed vLLM's package directory (its source is read, never imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    return Path(spec.origin).parent


def methods(path: Path, cls: str) -> dict[str, list[str]]:
    """Each method of class CLS in PATH, with its arguments' names."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {f.name: [a.arg for a in f.args.args] for f in node.body
            if isinstance(f, ast.FunctionDef)}


def test_vllm_0260_keeps_what_the_hook_wraps_where_it_looks() -> None:
    """The installed vLLM's source, not imported: the handler's transfer_async(self,
    job_id, src_spec, dst_spec), its public wait / dst_tensors / gpu_to_cpu /
    kv_cache_groups_data_refs, and the connector worker's __init__(self, spec,
    kv_cache_config)."""
    root = installed_vllm()

    handler = methods(root / "v1/kv_offload/cpu/gpu_worker.py", hook.HANDLER)
    assert handler[hook.LOAD] == ["self", "job_id", "src_spec", "dst_spec"]
    assert handler["wait"] == ["self", "job_ids"]
    source = (root / "v1/kv_offload/cpu/gpu_worker.py").read_text()
    for attribute in ("self.dst_tensors", "self.gpu_to_cpu", "self.kv_cache_groups_data_refs"):
        assert attribute in source
    worker = methods(root / "distributed/kv_transfer/kv_connector/v1/offloading/worker.py",
                     hook.WORKER)
    assert worker[hook.INIT] == ["self", "spec", "kv_cache_config"]
    assert "self.block_indices" in (root / "v1/kv_offload/base.py").read_text()


class FlowRunner:
    """A runner that records the gate's traffic in order: steps (name, replica, whether
    the control file existed) and sends (replica, salt), answering nothing."""

    def __init__(self, control: Path) -> None:
        from pytest_sharedkv.corpus.cases import Case, CaseSet

        self.control = control
        self.cases = CaseSet("copy", 32, [Case(f"control-{i:02d}", "control", "3k", "w",
                                               "0" * 64, 3041, (1,), 47 if i % 2 == 0 else 49)
                                          for i in range(8)], zeroed_chunk=47)
        self.concurrency = 8
        self.events: list[tuple[Any, ...]] = []
        self.run = self

    def answer(self, case: str, step: str) -> None:
        return None

    def salt(self, key: str) -> str:
        return f"salt-{key}"

    def settle_for(self, cases: Any, group: str = "gate") -> float:
        return 0.0

    def log(self, line: str) -> None:
        pass

    def step(self, group: str, step: Any, cases: Any) -> None:
        self.events.append(("step", step.name, step.replica, self.control.exists()))

    def send(self, replica: str, case_id: str, step: str, text: str, salt: str) -> Any:
        from pytest_sharedkv.service.answers import Answer

        self.events.append(("send", replica, salt, self.control.exists()))
        return Answer(case_id, step, replica)


def test_the_native_gate_fills_b_evicts_its_gpu_cache_then_loads_under_the_control(
        tmp_path: Path) -> None:
    """B answers the controls once, then enough prompts of their own namespaces to fill
    its GPU cache and a pass more (never under the control file), then the gated step;
    on the shared pool the gate is A's cold step and B's cross step, as before."""
    from pytest_sharedkv.service.sensitivity import run_gate

    control, log = gate_paths(tmp_path)
    runner = FlowRunner(control)
    stack = {"stack": "native", "gpu_blocks": 1530, "block_size": 16}
    run_gate(runner, control, log, stack)  # type: ignore[arg-type]
    steps = [e for e in runner.events if e[0] == "step"]
    assert steps == [("step", "cold", "A", False), ("step", "cross", "B", False),
                     ("step", "receiver-local", "B", True)]
    sends = runner.events[2:-1]
    assert len(sends) == 3 * 8  # ceil(1530 * 16 / (8 * 3041)) + 1 passes of the 8 controls
    assert {(e[1], e[3]) for e in sends} == {("B", False)}
    assert len({e[2] for e in sends}) == 24 and not {e[2] for e in sends} & {
        runner.salt(c.id) for c in runner.cases.cases}
    runner = FlowRunner(control)
    run_gate(runner, control, log, {"stack": "mp"})  # type: ignore[arg-type]
    assert runner.events == [("step", "cold", "A", False), ("step", "cross", "B", True)]
