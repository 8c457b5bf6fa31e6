"""The service tier's sensitivity gate for LMCache's in-process connector: inside each vLLM
replica, while the control file exists, every retrieve hands the engine zeros for the
chunks it names.

There is no MP server to hook on this stack; the replica's own LMCache engine is the one
that moves KV into vLLM's pages. LMCache 0.5.6's ``LMCacheEngine.retrieve``
(``v1/cache_engine.py``) hands every chunk it found, with its token offsets, to one call
of its GPU connector: ``batched_to_gpu(memory_objs, starts, ends, **kwargs)``
(``v1/gpu_connector/gpu_connectors.py``; ``CreateGPUConnector`` builds V2 for vLLM on
CUDA, V3 where ``use_gpu_connector_v3``). The hook wraps that method of both classes and
zeroes, before the copy, each memory object whose start falls in a named chunk (the chunk
index is the start over the chunk size the launch gives). What it zeroed, that it loaded
and what it wrapped go where ``corrupt_hook`` writes them, so the gate reads both alike.

Loaded through ``inject/sitecustomize.py`` when ``SHAREDKV_INPROCESS_GATE_CONTROL`` is
set. Standard library only at import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import corrupt_hook, post_import

CONTROL_ENV = "SHAREDKV_INPROCESS_GATE_CONTROL"  # the control file the suite writes
LOG_ENV = "SHAREDKV_INPROCESS_GATE_LOG"  # one line per zeroed chunk (corrupt_hook's form)
CHUNK_ENV = "SHAREDKV_INPROCESS_GATE_CHUNK"  # LMCache's chunk_size, in tokens
TAG = "inprocess-gate"
MODULE = "lmcache.v1.gpu_connector.gpu_connectors"
CLASSES = ("VLLMPagedMemGPUConnectorV2", "VLLMPagedMemGPUConnectorV3")
METHOD = "batched_to_gpu"
TARGETS = {MODULE: list(CLASSES)}
GROUP = 0  # the log's object-group column: the in-process engine moves one group


def zeroing(control: Path, log: str | None, chunk_size: int,
            fn: Callable[..., Any]) -> Callable[..., Any]:
    """FN (a ``batched_to_gpu``) that first zeroes the memory objects of named chunks."""

    @functools.wraps(fn)
    def batched_to_gpu(self: Any, memory_objs: Any, starts: Any, ends: Any,
                       *args: Any, **kwargs: Any) -> Any:
        named = set(corrupt_hook.chunks_to_zero(control))
        if named:
            for obj, start in zip(memory_objs, starts, strict=False):
                chunk = int(start) // chunk_size
                if obj is not None and chunk in named:
                    corrupt_hook.zero(obj, log, GROUP, chunk)
        return fn(self, memory_objs, starts, ends, *args, **kwargs)

    return batched_to_gpu


def wrapper(control: Path, log: str | None, chunk_size: int) -> post_import.Wrapper:
    """Wraps a connector class's ``batched_to_gpu`` in place (the class itself is kept)."""

    def wrap(name: str, cls: Any) -> Any:
        fn = getattr(cls, METHOD, None)
        if isinstance(cls, type) and callable(fn):
            setattr(cls, METHOD, zeroing(control, log, chunk_size, fn))
            corrupt_hook.log_wrapped(log, f"{name}.{METHOD}")
        return cls

    return wrap


def install() -> post_import.PostImportFinder | None:
    return corrupt_hook.arm(TAG, TARGETS, wrapper, CONTROL_ENV, LOG_ENV,
                            verb="zeroing named chunks in", chunk_env=CHUNK_ENV,
                            where=" in this replica")
