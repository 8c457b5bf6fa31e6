"""The service tier's sensitivity gate on vLLM's native CPU offload: inside replica B, while
the control file names chunk K, the GPU blocks that a load from B's own CPU tier fills
with tokens [K * chunk, (K + 1) * chunk) of a request are zeroed once that load's copy is
done.

Read from vLLM 0.26.0's source; the gate proven with it on the H200
(``fixtures/lmcache/h200/native-offloading-vllm-0.26.0*``). The functions it depends on:

* ``vllm/v1/kv_offload/cpu/gpu_worker.py``: ``SingleDirectionOffloadingHandler.
  transfer_async(self, job_id, src_spec, dst_spec)``, the copy itself. The CPU -> GPU
  handler (``gpu_to_cpu`` False, ``CPUOffloadingWorker._load_handler``) enqueues one
  batched copy on a stream of its own and returns; ``dst_spec`` is a ``GPULoadStoreSpec``
  (``v1/kv_offload/base.py``): ``block_ids`` (GPU block ids, ordered by KV-cache group),
  ``group_sizes[g]`` (how many of them are group g's) and ``block_indices[g]`` (the index,
  in the request, of group g's first loaded block: the scheduler's
  ``update_state_after_alloc`` in ``distributed/kv_transfer/kv_connector/v1/offloading/
  scheduler.py`` builds it). Group g's i-th block therefore holds the request's tokens
  ``[(block_indices[g] + i) * B_g, (block_indices[g] + i + 1) * B_g)``. The handler also
  keeps ``dst_tensors`` (the GPU KV tensors, ``(num_blocks, page_bytes)`` int8),
  ``kv_cache_groups_data_refs`` (per group, which tensors and how many bytes of a page)
  and ``wait(job_ids)`` (the host waits on the copy's end event).
* ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py``:
  ``OffloadingConnectorWorker.__init__(self, spec, kv_cache_config)``. The handler sees
  block ids but not the tokens a block holds (``B_g``) nor whether a group is attention
  (per-token KV) or Mamba/Gated DeltaNet state: the connector worker's
  ``spec.tokens_per_block`` (``v1/kv_offload/base.py`` ``OffloadingSpec``: each group's
  ``kv_cache_spec.block_size`` times the decode context parallel size, as
  ``offloading/config.py`` ``build_offloading_config`` makes it) and its
  ``kv_cache_config.kv_cache_groups[g].kv_cache_spec`` (an ``AttentionSpec`` or a
  ``MambaSpec``, the classes the worker itself tells apart) have both. The hook reads
  them when the worker is made, in the same process that later copies.

Only attention groups are zeroed (a recurrent state block is the state after its last
token, not the KV of its tokens), and a block is zeroed whole: exact where the block
divides the chunk (the copy model's attention block is 16 tokens, its chunk 32: chunk 47
is blocks 94 and 95); a larger block zeroes its neighbours' tokens too, said on stderr.
vLLM's null block (id 0) is never touched.

Ordering: after the wrapped ``transfer_async`` returns, the hook calls the handler's
``wait({job_id})`` (the host blocks on the copy's end event), zeroes the blocks on the
current stream and synchronizes that stream before returning. Zeroing on the copy's own
stream would need the handler's private transfer queue and a re-recorded end event
(``get_finished`` reports a load done when that event fires, and the request then runs);
synchronizing first depends only on public attributes and leaves no window in which the
model could read the loaded blocks before they are zeroed, at the price of a blocking load
while the gate's requests run (the only time the control file exists). The GPU's copy is
zeroed, not the CPU tier's, so the next load of the same prefix is intact; the zeroed GPU
blocks keep their prefix hashes, which is harmless because the gate's controls have a
namespace of their own.

Logs as ``corrupt_hook`` does (one line per zeroed block: group, chunk, bytes; that it
loaded; each method it wrapped), so ``service.sensitivity.run_gate`` reads it unchanged.
A vLLM without a target wraps nothing of it and the gate says which are missing; an error
inside the hook is printed and disables it (the engine never sees it), and the gate,
seeing no zeroed block, is VOID. Loaded through ``inject/sitecustomize.py`` when
``SHAREDKV_NATIVE_GATE_CONTROL`` is set. Standard library only at import.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import corrupt_hook, post_import

CONTROL_ENV = "SHAREDKV_NATIVE_GATE_CONTROL"  # the control file the suite writes
LOG_ENV = "SHAREDKV_NATIVE_GATE_LOG"  # one line per zeroed block (corrupt_hook's form)
CHUNK_ENV = "SHAREDKV_NATIVE_GATE_CHUNK"  # the corpus's chunk, in tokens
TAG = "native-gate"
HANDLER_MODULE = "vllm.v1.kv_offload.cpu.gpu_worker"
HANDLER = "SingleDirectionOffloadingHandler"
LOAD = "transfer_async"
WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker"
WORKER = "OffloadingConnectorWorker"
INIT = "__init__"
TARGETS = {HANDLER_MODULE: [HANDLER], WORKER_MODULE: [WORKER]}
METHODS = {HANDLER: LOAD, WORKER: INIT}
# what the gate needs wrapped, as the log names them: both, or it cannot zero anything
NEEDED = (f"{HANDLER_MODULE}:{HANDLER}.{LOAD}", f"{WORKER_MODULE}:{WORKER}.{INIT}")
NULL_BLOCK = 0  # vLLM's BlockPool keeps block 0 as the null block


@dataclass(frozen=True)
class Group:
    """One KV-cache group as the connector worker's config gives it."""

    tokens_per_block: int
    attention: bool  # per-token KV (zeroed); False: recurrent state or unknown (kept)


@dataclass(frozen=True)
class Zeroed:
    """One GPU block a load fills with tokens of a named chunk."""

    group: int
    chunk: int
    block_id: int
    first: int  # the block's first token in the request
    tokens: int  # the tokens it holds


class _State:
    """This process's view: the groups (None until the connector worker is made) and
    whether an error disabled the hook."""

    def __init__(self) -> None:
        self.groups: list[Group] | None = None
        self.disabled = False
        self.said: set[str] = set()

    def say(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            print(f"sharedkv-{TAG}: {line}", file=sys.stderr, flush=True)


STATE = _State()


def _is_attention(spec: Any) -> bool:
    """Whether a group's ``kv_cache_spec`` holds per-token KV: an ``AttentionSpec`` and no
    ``MambaSpec`` in its class's ancestry (names, so nothing of vLLM is imported), or a
    ``UniformTypeKVCacheSpecs`` of attention specs only."""
    names = {c.__name__ for c in type(spec).__mro__}
    if "MambaSpec" in names:
        return False
    if "AttentionSpec" in names:
        return True
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, dict) and inner:
        return all(_is_attention(s) for s in inner.values())
    return False


def groups_of(kv_cache_config: Any, tokens_per_block: Sequence[int] | None = None
              ) -> list[Group]:
    """The groups of a vLLM ``KVCacheConfig``: each one's tokens a block (the offloading
    spec's ``tokens_per_block`` where given, which is the spec's ``block_size`` times the
    decode context parallel size; else ``block_size``) and kind."""
    groups = list(kv_cache_config.kv_cache_groups)
    sizes = list(tokens_per_block or ())
    if len(sizes) != len(groups):
        sizes = [g.kv_cache_spec.block_size for g in groups]
    return [Group(int(n), _is_attention(g.kv_cache_spec)) for n, g in zip(sizes, groups,
                                                                         strict=True)]


def blocks_to_zero(dst_spec: Any, groups: Sequence[Group], chunks: Iterable[int],
                   chunk_size: int) -> list[Zeroed]:
    """The GPU blocks of a ``GPULoadStoreSpec`` that hold tokens of the named CHUNKS (of
    CHUNK_SIZE tokens), attention groups only, the null block never."""
    named = sorted(set(chunks))
    sizes = list(dst_spec.group_sizes)
    firsts = list(dst_spec.block_indices)
    ids = [int(b) for b in dst_spec.block_ids]
    if len(sizes) != len(groups) or len(firsts) != len(groups) or sum(sizes) != len(ids):
        raise ValueError(f"a load of {len(ids)} blocks in groups {sizes} (first blocks "
                         f"{firsts}) does not match the {len(groups)} KV-cache groups")
    out: list[Zeroed] = []
    offset = 0
    for g, (size, first, group) in enumerate(zip(sizes, firsts, groups, strict=True)):
        mine, offset = ids[offset:offset + size], offset + size
        if not group.attention:
            continue
        per = group.tokens_per_block
        for i, block_id in enumerate(mine):
            lo = (int(first) + i) * per
            for chunk in named:
                if block_id != NULL_BLOCK and lo < (chunk + 1) * chunk_size \
                        and chunk * chunk_size < lo + per:
                    out.append(Zeroed(g, chunk, block_id, lo, per))
    return out


def zero_blocks(handler: Any, blocks: Sequence[Zeroed], log: str | None,
                chunk_size: int) -> None:
    """Zero each block's bytes in every GPU tensor of its group (the bytes the copy wrote:
    the group's un-padded page) and log it; then synchronize the stream it ran on."""
    refs = handler.kv_cache_groups_data_refs
    tensors = handler.dst_tensors
    touched: list[Any] = []
    for block in blocks:
        widths: dict[int, int] = {}
        for ref in refs[block.group]:
            widths[ref.tensor_idx] = max(widths.get(ref.tensor_idx, 0), int(ref.page_size_bytes))
        nbytes = 0
        for index, width in widths.items():
            tensor = tensors[index]
            tensor[block.block_id, :width].zero_()
            touched.append(tensor)
            nbytes += width
        zeroed(block, nbytes, log, chunk_size, STATE.say)
    synchronize(touched)


def zeroed(block: Zeroed, nbytes: int, log: str | None, chunk_size: int,
           say: Callable[[str], None]) -> None:
    """Log a zeroed block (and say so where it was zeroed past its chunk's tokens)."""
    if block.tokens > chunk_size or block.first % chunk_size:
        say(f"block {block.block_id} of group {block.group} holds tokens "
            f"{block.first}..{block.first + block.tokens - 1}: zeroed whole, "
            f"beyond chunk {block.chunk}")
    corrupt_hook.log_zeroed(log, block.group, block.chunk, nbytes)


def synchronize(tensors: Iterable[Any]) -> None:
    """Wait for the current stream of each GPU the TENSORS live on: the zeroing is done
    before the load can be reported done."""
    devices = {t.device for t in tensors if getattr(t.device, "type", "cpu") != "cpu"}
    if devices:
        import torch

        for device in devices:
            torch.cuda.current_stream(device).synchronize()


def zeroing_load(control: Path, log: str | None, chunk_size: int,
                 fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (a handler's ``transfer_async``) that, on the CPU -> GPU handler while the
    control file names chunks, waits for the copy it submitted and zeroes their blocks."""

    @functools.wraps(fn)
    def transfer_async(self: Any, job_id: Any, src_spec: Any, dst_spec: Any,
                       *args: Any, **kwargs: Any) -> Any:
        submitted = fn(self, job_id, src_spec, dst_spec, *args, **kwargs)
        if STATE.disabled or getattr(self, "gpu_to_cpu", True) or submitted is False:
            return submitted
        named = corrupt_hook.chunks_to_zero(control)
        if not named:
            return submitted
        try:
            if STATE.groups is None:
                STATE.say(f"a load came before {WORKER}.{INIT} gave the KV-cache groups: "
                          "nothing zeroed")
                return submitted
            blocks = blocks_to_zero(dst_spec, STATE.groups, named, chunk_size)
            if blocks:
                self.wait({job_id})  # the copy is done before anything is zeroed
                zero_blocks(self, blocks, log, chunk_size)
        except Exception as exc:  # report, disable, never break the engine
            STATE.disabled = True
            STATE.say(f"disabled: could not zero a load of job {job_id}: "
                      f"{type(exc).__name__}: {exc}")
        return submitted

    return transfer_async


def reading_groups(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (the connector worker's ``__init__``) that then keeps its KV-cache groups."""

    @functools.wraps(fn)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        fn(self, *args, **kwargs)
        try:
            config = getattr(self, "kv_cache_config", None)
            if config is None:
                config = kwargs.get("kv_cache_config", args[1] if len(args) > 1 else None)
            STATE.groups = groups_of(config, getattr(getattr(self, "spec", None),
                                                     "tokens_per_block", None))
            STATE.say("KV-cache groups: " + ", ".join(
                f"{g.tokens_per_block}-token {'attention' if g.attention else 'state'}"
                for g in STATE.groups))
        except Exception as exc:  # report, disable, never break the engine
            STATE.disabled = True
            STATE.say(f"disabled: could not read the KV-cache groups: "
                      f"{type(exc).__name__}: {exc}")

    return __init__


def wrapper(control: Path, log: str | None, chunk_size: int) -> post_import.Wrapper:
    """Wraps a target class's method in place (the class itself is kept)."""

    def wrap(name: str, cls: Any) -> Any:
        method = METHODS.get(name.rpartition(":")[2])
        fn = getattr(cls, method, None) if method else None
        if method is not None and isinstance(cls, type) and callable(fn):
            setattr(cls, method, zeroing_load(control, log, chunk_size, fn)
                    if method == LOAD else reading_groups(fn))
            corrupt_hook.log_wrapped(log, f"{name}.{method}")
        return cls

    return wrap


def install() -> post_import.PostImportFinder | None:
    return corrupt_hook.arm(TAG, TARGETS, wrapper, CONTROL_ENV, LOG_ENV,
                            verb="zeroing named chunks of CPU-tier loads in", chunk_env=CHUNK_ENV,
                            where=" in this replica")
