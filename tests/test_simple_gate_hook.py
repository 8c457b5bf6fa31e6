"""The sensitivity gate's hook in a replica on vLLM's SimpleCPUOffloadConnector, against
stand-ins of vLLM 0.26.0's classes it wraps and the worker that calls them (the same
module paths, names and signatures), on CPU tensors, in a child armed as replica B is:
while the control file names chunk K, the GPU blocks a CPU -> GPU load writes with tokens
[K * 32, (K + 1) * 32) of a request are zeroed after the copy (the stand-in's copy thread
publishes its event late and the copy lands only when that event is waited on or
polled, so a hook that zeroed before waiting would see its zeros overwritten), attention
groups only, only blocks the load writes, never a store; without the control file, or
without the scheduler side's block table, nothing changes; a vLLM without its targets
wraps nothing and the gate is VOID naming them. Not run on a GPU: the stand-ins are all
that proves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.engine_hooks import corrupt_hook
from pytest_sharedkv.engine_hooks import simple_gate_hook as hook
from pytest_sharedkv.engine_hooks.native_gate_hook import Group, Zeroed
from pytest_sharedkv.service.sensitivity import PROVEN, VOID, GateResult, judge
from pytest_sharedkv.stack.launch.spec import INJECT_DIR, gate_paths
from tests.test_native_gate_hook import (  # vLLM 0.26.0's spec classes, stood in
    SPECS,
    installed_vllm,
    methods,
)

# vLLM 0.26.0's distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py,
# reduced: one instance per role, the worker's hands on to SimpleCPUOffloadWorker
CONNECTOR = """
from vllm.v1.simple_kv_offload.worker import SimpleCPUOffloadWorker

class SimpleCPUOffloadConnector:
    def __init__(self, vllm_config, role, kv_cache_config):
        self.worker_handler = None
        if role == "WORKER":
            self.worker_handler = SimpleCPUOffloadWorker(vllm_config, kv_cache_config, 1)

    def register_kv_caches(self, kv_caches):
        if self.worker_handler is not None:
            self.worker_handler.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata):
        if self.worker_handler is not None:
            self.worker_handler.bind_connector_metadata(connector_metadata)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass  # the manager's bookkeeping: nothing the hook reads

    def get_finished(self, finished_req_ids):
        if self.worker_handler is not None:
            return self.worker_handler.get_finished(finished_req_ids)
        return None, None
"""
# v1/simple_kv_offload/worker.py, reduced: get_finished launches the step's load, then its
# store, then polls the load events (worker.py:224-267)
WORKER = """
from vllm.v1.simple_kv_offload.copy_backend import DmaCopyBackend

class SimpleCPUOffloadWorker:
    def __init__(self, vllm_config, kv_cache_config, cpu_capacity_bytes):
        self._backend = DmaCopyBackend()
        self._load_events, self._store_events = [], []
        self._load_hwm = -1
        self._connector_metadata = None
        self._pending_load_event_indices = set()

    def register_kv_caches(self, kv_caches):
        import torch
        self.gpu_kv_caches = dict(kv_caches)
        self.cpu_kv_caches = {n: torch.full_like(t, 7) for n, t in kv_caches.items()}
        self._backend.init(self.gpu_kv_caches, self.cpu_kv_caches, "cpu", "load", "store")

    def bind_connector_metadata(self, metadata):
        self._connector_metadata = metadata
        if metadata.load_event >= 0:
            self._pending_load_event_indices.add(metadata.load_event)

    def get_finished(self, finished_req_ids):
        metadata = self._connector_metadata
        if metadata is not None:
            if metadata.load_cpu_blocks:
                self._backend.launch_copy(metadata.load_cpu_blocks, metadata.load_gpu_blocks,
                                          is_store=False, event_idx=metadata.load_event,
                                          events_list=self._load_events)
            if metadata.store_gpu_blocks:
                self._backend.launch_copy(metadata.store_gpu_blocks, metadata.store_cpu_blocks,
                                          is_store=True, event_idx=metadata.store_event,
                                          events_list=self._store_events, wait_event=None)
        finished = set()
        if self._pending_load_event_indices:
            while self._load_events and self._load_events[0][1].query():
                self._load_hwm = self._load_events.pop(0)[0]
            for j in [j for j in self._pending_load_event_indices if j <= self._load_hwm]:
                self._pending_load_event_indices.discard(j)
                finished.update(metadata.load_event_to_reqs.get(j) or [])
        return None, finished or None
"""
# v1/simple_kv_offload/copy_backend.py, reduced: a thread copies and publishes the event;
# here the event is published late and the copy lands when the event is waited on or polled
BACKEND = """
import queue, threading, time

class _Event:
    def __init__(self, copy):
        self._copy = copy
    def synchronize(self):
        if self._copy is not None:
            self._copy()
            self._copy = None
    def query(self):
        self.synchronize()
        return True

class DmaCopyBackend:
    def init(self, gpu_caches, cpu_caches, device, load_stream, store_stream):
        self._gpu, self._cpu = gpu_caches, cpu_caches
        self._queue = queue.SimpleQueue()
        threading.Thread(target=self._copy_loop, daemon=True).start()

    def launch_copy(self, src_blocks, dst_blocks, is_store, event_idx, events_list,
                    wait_event=None):
        self._queue.put((src_blocks, dst_blocks, is_store, event_idx, events_list))

    def _copy_loop(self):
        while True:
            src_blocks, dst_blocks, is_store, event_idx, events_list = self._queue.get()
            src, dst = (self._gpu, self._cpu) if is_store else (self._cpu, self._gpu)
            def copy(src_blocks=src_blocks, dst_blocks=dst_blocks, src=src, dst=dst):
                for s, d in zip(src_blocks, dst_blocks):
                    for name in dst:
                        dst[name][d] = src[name][s]
            time.sleep(0.05)
            events_list.append((event_idx, _Event(copy)))
"""
# one step's load as the scheduler builds it: GROUPS (block size, kind), REQUESTS (id, its
# block table per group, and whether the scheduler side saw it), LOADED (GPU ids written)
LOAD = """
import json, sys, torch
from types import SimpleNamespace as NS
from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import (
    SimpleCPUOffloadConnector as C)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
args = json.loads(sys.argv[1])
kinds = {"attention": FullAttentionSpec, "state": MambaSpec}
config = NS(kv_cache_groups=[NS(kv_cache_spec=kinds[k](b)) for b, k in args["groups"]])
vllm_config = NS(parallel_config=NS(decode_context_parallel_size=1,
                                    prefill_context_parallel_size=1))
scheduler, worker = C(vllm_config, "SCHEDULER", config), C(vllm_config, "WORKER", config)
gpu = {f"layer.{i}": torch.full((160, 8), 1, dtype=torch.int8) for i in range(2)}
worker.register_kv_caches(gpu)
for rid, table, seen in args["requests"]:
    if seen:
        blocks = NS(get_block_ids=lambda table=table: tuple(list(t) for t in table))
        scheduler.update_state_after_alloc(NS(request_id=rid), blocks, 128)
loaded = args["loaded"]
store = args.get("store", False)
empty = dict(load_event=-1, load_gpu_blocks=[], load_cpu_blocks=[], store_event=-1,
             store_gpu_blocks=[], store_cpu_blocks=[])
step = dict(load_event=3, load_gpu_blocks=loaded, load_cpu_blocks=list(range(len(loaded))))
if store:
    step = dict(store_event=3, store_gpu_blocks=loaded, store_cpu_blocks=list(range(len(loaded))))
reqs = {3: [r[0] for r in args["requests"]]}
worker.bind_connector_metadata(NS(**{**empty, **step}, load_event_to_reqs=reqs))
_, done = worker.get_finished(set())
for _ in range(400):
    if store or done:
        break
    worker.bind_connector_metadata(NS(**empty, load_event_to_reqs=reqs))
    _, done = worker.get_finished(set())
    import time; time.sleep(0.01)
assert store or done == set(reqs[3]), done
out = {str(b): gpu["layer.0"][b].tolist() + gpu["layer.1"][b].tolist()
       for b in args.get("show", loaded)}
print(json.dumps(out))
"""


def stand_in(root: Path, connector: str = CONNECTOR, backend: str = BACKEND) -> Path:
    site = root / "site"
    files = {"vllm/distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py":
             connector, "vllm/v1/simple_kv_offload/worker.py": WORKER,
             "vllm/v1/simple_kv_offload/copy_backend.py": backend,
             "vllm/v1/kv_cache_interface.py": SPECS}
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for parent in path.relative_to(site).parents:
            if str(parent) != ".":
                (site / parent / "__init__.py").touch()
    return site


def armed_env(tmp_path: Path, site: Path) -> tuple[dict[str, str], Path, Path]:
    control, log = gate_paths(tmp_path)
    env = {**os.environ, hook.CONTROL_ENV: str(control), hook.LOG_ENV: str(log),
           hook.CHUNK_ENV: "32", "PYTHONPATH": os.pathsep.join([str(INJECT_DIR), str(site)])}
    return env, control, log


def run_load(tmp_path: Path, chunks: list[int] | None, load: dict[str, Any]
             ) -> tuple[dict[str, list[int]], Path, str]:
    """One step's load in a child armed as replica B (CHUNKS None: no control file): each
    loaded GPU block's bytes afterwards, the log, the child's stderr."""
    pytest.importorskip("torch")
    env, control, log = armed_env(tmp_path, stand_in(tmp_path))
    if chunks is not None:
        control.write_text(json.dumps({"zero_chunks": chunks}))
    done = subprocess.run([sys.executable, "-c", LOAD, json.dumps(load)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), log, done.stderr


COPIED, ZEROED = [7] * 16, [0] * 16
# a 16-token attention group: request r1's blocks 0..89 were on the GPU (ids 1..90), 90..97
# load into GPU ids 110..117: chunk 47 (tokens 1504..1535) is its blocks 94 and 95, GPU 114
# and 115; r2 in the same load takes its first blocks (no chunk 47) into GPU 120..123
R1 = [list(range(1, 91)) + list(range(110, 118))]
R2 = [list(range(120, 124))]
ATTENTION = {"groups": [[16, "attention"]], "requests": [["r1", R1, True], ["r2", R2, True]],
             "loaded": list(range(110, 118)) + list(range(120, 124))}


def test_the_named_chunks_blocks_are_zeroed_after_the_copy(tmp_path: Path) -> None:
    out, log, _ = run_load(tmp_path, [47], ATTENTION)
    assert {b for b, data in out.items() if data == ZEROED} == {"114", "115"}
    assert all(data == COPIED for b, data in out.items() if b not in ("114", "115"))
    # one line a zeroed block: group 0, chunk 47, its row in both GPU caches
    assert corrupt_hook.read_log(log) == [(0, 47, 16), (0, 47, 16)]
    assert corrupt_hook.armed_path(log).exists()
    assert sorted(corrupt_hook.read_wrapped(log) or ()) == sorted(hook.NEEDED)  # each once


def test_without_the_control_file_on_a_store_or_without_the_table_nothing_changes(
        tmp_path: Path) -> None:
    out, log, _ = run_load(tmp_path / "off", None, ATTENTION)
    assert all(data == COPIED for data in out.values()) and not log.exists()
    out, log, _ = run_load(tmp_path / "store", [47], {**ATTENTION, "store": True})
    assert corrupt_hook.read_log(log) == []  # a GPU -> CPU store is never zeroed
    # the scheduler side elsewhere (not the uni executor's one process): said, not zeroed
    unseen = {**ATTENTION, "requests": [["r1", R1, False]], "loaded": list(range(110, 118))}
    out, log, err = run_load(tmp_path / "unseen", [47], unseen)
    assert all(data == COPIED for data in out.values())
    assert corrupt_hook.read_log(log) == [] and "r1 was loaded without its block table" in err


def test_a_hybrid_load_zeroes_loaded_attention_blocks_only(tmp_path: Path) -> None:
    """Qwen3-Next's copy model: a 16-token attention group and a Gated DeltaNet state
    group. Chunk 47's attention block 94 was a GPU prefix hit (not loaded: kept), block 95
    is loaded (zeroed); the state group's loaded blocks stay as copied."""
    attention = [*range(1, 96), 131, 132]  # block 94 is GPU 95, 95 is GPU 131
    state = [0] * 95 + [140, 141]  # block 95 is GPU 140
    load = {"groups": [[16, "attention"], [16, "state"]],
            "requests": [["r1", [attention, state], True]], "loaded": [131, 132, 140, 141],
            "show": [95, 131, 132, 140, 141]}
    out, log, _ = run_load(tmp_path, [47], load)
    assert {b for b, data in out.items() if data == ZEROED} == {"131"}
    assert out["95"] == [1] * 16 and out["132"] == out["140"] == out["141"] == COPIED
    assert corrupt_hook.read_log(log) == [(0, 47, 16)]


def test_a_block_larger_than_the_chunk_is_zeroed_whole_and_said(tmp_path: Path) -> None:
    table = [[*range(1, 24), 150, 151]]  # 64-token blocks: 23 (GPU 150) holds 1472..1535
    load = {"groups": [[64, "attention"]], "requests": [["r1", table, True]],
            "loaded": [150, 151]}
    out, log, err = run_load(tmp_path, [47], load)
    assert out["150"] == ZEROED and out["151"] == COPIED
    assert corrupt_hook.read_log(log) == [(0, 47, 16)]
    assert "zeroed whole, beyond chunk 47" in err


def test_a_table_it_cannot_map_disables_the_hook_and_never_raises(tmp_path: Path) -> None:
    load = {**ATTENTION, "requests": [["r1", [*R1, [5]], True]], "loaded": [110, 114]}
    out, log, err = run_load(tmp_path, [47], load)
    assert all(data == COPIED for data in out.values())
    assert corrupt_hook.read_log(log) == [] and "disabled: could not zero a load" in err


def test_blocks_to_zero_maps_positions_and_keeps_what_the_load_does_not_write() -> None:
    groups = [Group(16, True), Group(16, False)]
    table = ([0, *range(1, 94), 200, 201], list(range(300, 396)))
    assert hook.blocks_to_zero(table, groups, [47], 32, [200, 201, 394, 395]) == [
        Zeroed(0, 47, 200, 1504, 16), Zeroed(0, 47, 201, 1520, 16)]
    assert hook.blocks_to_zero(table, groups, [47], 32, [201]) == [Zeroed(0, 47, 201, 1520, 16)]
    assert hook.blocks_to_zero(table, groups, [46], 32, [200, 201]) == []


@pytest.mark.parametrize("missing", ["launch_copy", "connector"])
def test_a_vllm_without_its_targets_wraps_nothing_and_the_gate_names_them(
        tmp_path: Path, missing: str) -> None:
    """launch_copy renamed; then the connector class too: only the backend's init is
    wrapped, and the gate names what it did not find."""
    connector = CONNECTOR.replace("SimpleCPUOffloadConnector", "Elsewhere") \
        if missing == "connector" else CONNECTOR
    site = stand_in(tmp_path, connector, BACKEND.replace("def launch_copy", "def submit"))
    env, _, log = armed_env(tmp_path, site)
    subprocess.run([sys.executable, "-c", f"import {hook.CONNECTOR_MODULE}"], env=env,
                   check=True, timeout=60, cwd=tmp_path)
    wrapped = corrupt_hook.read_wrapped(log)
    launch = f"{hook.BACKEND_MODULE}:{hook.BACKEND}.launch_copy"
    assert sorted(wrapped or ()) == (
        [f"{hook.BACKEND_MODULE}:{hook.BACKEND}.init"] if missing == "connector"
        else sorted(n for n in hook.NEEDED if n != launch))
    result = judge(GateResult("", "", 47, copying=4, others=4, others_exact=4,
                              zeroed_chunks_logged=0, hook_loaded=True, wrapped=wrapped),
                   [], stack="native", connector="SimpleCPUOffloadConnector")
    assert result.status == VOID
    assert "never zeroed a chunk in replica B's vLLM" in result.message
    named = result.message.split("found no ", 1)[1]
    assert launch in named
    if missing == "connector":
        assert f"{hook.CONNECTOR_MODULE}:{hook.CONNECTOR}.__init__" in result.message


def test_an_applied_simple_gate_is_judged_as_on_the_other_stacks() -> None:
    result = judge(GateResult("", "", 47, copying=4, changed=4, others=4, others_exact=4,
                              zeroed_chunks_logged=8, hook_loaded=True,
                              wrapped=list(hook.NEEDED)), [], stack="native",
                   connector="SimpleCPUOffloadConnector")
    assert result.status == PROVEN
    assert "chunk 47 zeroed in every load from B's CPU tier" in result.message


def test_vllm_0260_keeps_what_the_hook_wraps_where_it_looks() -> None:
    """The installed vLLM's source, not imported: the connector's three methods, the
    backend's init and launch_copy with their arguments, the worker launching loads through
    launch_copy and the copy thread publishing (event_idx, event)."""
    root = installed_vllm()

    connector = methods(root / "distributed/kv_transfer/kv_connector/v1/"
                        "simple_cpu_offload_connector.py", hook.CONNECTOR)
    assert connector["__init__"] == ["self", "vllm_config", "role", "kv_cache_config"]
    assert connector["update_state_after_alloc"] == ["self", "request", "blocks",
                                                     "num_external_tokens"]
    assert connector["bind_connector_metadata"] == ["self", "connector_metadata"]
    backend_file = root / "v1/simple_kv_offload/copy_backend.py"
    backend = methods(backend_file, hook.BACKEND)
    assert backend["init"][:2] == ["self", "gpu_caches"]
    assert backend["launch_copy"][:6] == ["self", "src_blocks", "dst_blocks", "is_store",
                                          "event_idx", "events_list"]
    assert "events_list.append((event_idx, event))" in backend_file.read_text()
    worker = (root / "v1/simple_kv_offload/worker.py").read_text()
    assert "self._backend.launch_copy(" in worker and "events_list=self._load_events" in worker
    assert "load_event_to_reqs" in (root / "v1/simple_kv_offload/metadata.py").read_text()


@pytest.mark.parametrize(("connector", "needed"), [
    ("SimpleCPUOffloadConnector", hook.NEEDED), ("OffloadingConnector", None), (None, None)])
def test_the_gate_names_the_hook_of_the_connector_the_record_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connector: str | None,
        needed: tuple[str, ...] | None) -> None:
    """run_gate hands the launch record's connector to the judge, whose VOID names that
    connector's hook's targets (the OffloadingConnector's hook's where none is named)."""
    from pytest_sharedkv.engine_hooks import native_gate_hook
    from pytest_sharedkv.service import sensitivity
    from tests.test_native_gate_hook import FlowRunner

    seen: list[str | None] = []
    monkeypatch.setattr(sensitivity, "judge", lambda *a, **k: seen.append(k["connector"]))
    control, log = gate_paths(tmp_path)
    stack = {"stack": "native", "gpu_blocks": 1530, "block_size": 16,
             **({"connector": connector} if connector else {})}
    sensitivity.run_gate(FlowRunner(control), control, log, stack)  # type: ignore[arg-type]
    assert seen == [connector]
    monkeypatch.undo()
    result = judge(GateResult("", "", 47, copying=4, others=4, others_exact=4,
                              zeroed_chunks_logged=0, hook_loaded=True, wrapped=[]),
                   [], stack="native", connector=seen[0])
    assert f"found none of its targets ({', '.join(needed or native_gate_hook.NEEDED)})" \
        in result.message
