"""Fault-sensitivity mode: a delay kernel on the current stream before every KV store and
retrieve, in the processes the suite launches (LMCache server and engines).

A stream-ordering bug in a copy path is latent when the producer finishes before anyone
looks; an imposed delay makes it a deterministic wrong answer. The launched processes get
``SHAREDKV_INJECT_DELAY_CYCLES`` and ``inject/`` on ``PYTHONPATH``; its
``sitecustomize`` calls :func:`install`, which wraps the target functions as their modules
load (a post-import hook), so nothing is imported early. Each wrapped call counts itself;
the counts are printed at exit, and with ``SHAREDKV_INJECT_LOG`` every delayed call
appends a line to that file, so a test can prove the delay ran in the server (a killed
process runs no atexit).

Where the delay sits matters. LMCache's torch fallback reads pointer and block-id tensors
back to the host (``.item()``, ``.tolist()``) at the start of
``multi_layer_block_kv_transfer``: that synchronizes the stream and swallows a delay queued
before it (measured on an H200: stores took 1.7 s instead of 0.05 s, answers stayed exact).
So the delay is also queued inside the fallback, after those reads and just before the
gather/scatter kernels (``_transfer_per_layer_*``), where the producer of a D2H copy (and
the consumer of an H2D copy) is the kernel that follows it on the server's stream.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_sharedkv.engine_hooks import post_import
from pytest_sharedkv.host.lmcache_source import GPU_OPS, defines, importable, memcpy_helpers

TAG = "inject"  # post-import wraps and log lines: sharedkv-inject: ...
CYCLES_ENV = "SHAREDKV_INJECT_DELAY_CYCLES"
TARGETS_ENV = "SHAREDKV_INJECT_TARGETS"
LOG_ENV = "SHAREDKV_INJECT_LOG"
ROLE_ENV = "SHAREDKV_INJECT_ROLE"  # names the process in the log (server, replica A, ...)
SERVER_ROLE = "server"  # the process whose copies the delay must reach
VOID = "VOID"  # how a delayed result that proves nothing begins
_FALLBACK_KERNELS = "lmcache.v1.platform.torch_ops.mp_mem_kernels"
# LMCache's entry points of KV stores and retrieves (server object groups, where 0.5.6 and
# 0.5.3 keep them; the engine-driven worker path; the torch fallback's kernels); the GPU
# connector helpers that reach lmcache_memcpy_async are discovered in LMCache's source
# (lmcache_source.py), so a newer LMCache's helpers (e.g. lmcache_memcpy_async_h2d_range)
# are delayed too.
FIXED_TARGETS = (
    "lmcache.v1.multiprocess.object_group_transfer:transfer_kv_per_object_group",
    "lmcache.v1.multiprocess.modules.lmcache_driven_transfer:transfer_kv_per_object_group",
    "lmcache.v1.multiprocess.transfer_context.base:gather_paged_kv_to_cpu",
    "lmcache.v1.multiprocess.transfer_context.base:scatter_cpu_to_paged_kv",
    *(f"{_FALLBACK_KERNELS}:_transfer_{kind}" for kind in (
        "per_layer_fused", "per_layer_nhd", "per_layer_hnd", "per_layer_mla",
        "per_layer_mla_tuple", "per_layer_kv_tuple", "cross_layer", "sglang_mha")),
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def default_targets() -> tuple[str, ...]:
    """The fixed entry points, then every discovered gpu_ops helper (read from source: this
    runs first thing in launched processes and imports nothing)."""
    helpers = tuple(f"{GPU_OPS}:{h.name}" for h in memcpy_helpers())
    return (FIXED_TARGETS[0], *helpers, *FIXED_TARGETS[1:])


def __getattr__(name: str) -> object:
    if name == "DEFAULT_TARGETS":  # the former constant, now discovered on use
        return default_targets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CALLS: Counter[str] = Counter()


def cycles_label(cycles: int) -> str:
    """1e8 for 100000000 (exact values only): short, and the same in ids and reports."""
    short = f"{cycles:.0e}".replace("e+0", "e").replace("e+", "e")
    return short if cycles and float(short) == cycles else str(cycles)


def cuda_delay(cycles: int) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda._sleep(cycles)


def log_call(name: str, log_env: str = LOG_ENV) -> None:
    """One line (pid, role, NAME) in the file LOG_ENV names, if it names one."""
    path = os.environ.get(log_env)
    if path:
        role = os.environ.get(ROLE_ENV, "process")
        with open(path, "a", encoding="utf-8") as log:  # one short line: an atomic append
            log.write(f"{os.getpid()}\t{role}\t{name}\n")


def read_log(path: Path) -> Counter[str]:
    """Logged calls per role, from a ``log_call`` file (``SHAREDKV_INJECT_LOG``, the sync
    hook's ``SHAREDKV_SYNC_LOG``); empty if none ran."""
    counts: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                counts[parts[1]] += 1
    return counts


def void_problem(calls: Mapping[str, int] | None, subject: str) -> str | None:
    """Why a delayed ``subject`` ("round", "check") proves nothing, or None: the delay
    must have run in the LMCache server for a stream-ordering fault to show."""
    if calls is not None and calls.get(SERVER_ROLE):
        return None
    return (f"{VOID}: the injected delay never ran in the LMCache server (delayed calls per "
            f"process: {dict(calls or {}) or 'none'}), so this {subject} cannot expose a "
            "stream-ordering fault")


def wrap(name: str, fn: Callable[..., Any], delay: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def delayed(*args: Any, **kwargs: Any) -> Any:
        CALLS[name] += 1
        log_call(name)
        delay()
        return fn(*args, **kwargs)

    return delayed


class TargetError(ValueError):
    """A SHAREDKV_INJECT_TARGETS value that cannot be honoured; the message says why."""


def parse_targets(text: str | None) -> dict[str, list[str]]:
    """``module:function,...`` (or the defaults for None/empty) -> {module: [functions]}."""
    targets: dict[str, list[str]] = {}
    for raw in (text.split(",") if text else default_targets()):
        item = raw.strip()
        if not item:
            continue  # a stray comma
        module, _, attribute = item.partition(":")
        if not (_IDENTIFIER.match(module) and attribute.isidentifier()):
            raise TargetError(f"{item!r} is not module:function")
        targets.setdefault(module, []).append(attribute)
    return targets


def check_targets(text: str) -> list[str]:
    """Why TEXT cannot be used as SHAREDKV_INJECT_TARGETS (empty: it can). Syntax always;
    where lmcache is importable, that every module exists and defines its function (read
    from source, nothing imported)."""
    try:
        targets = parse_targets(text)
    except TargetError as exc:
        return [str(exc)]
    if not importable("lmcache"):
        return []
    problems = []
    for module, attributes in targets.items():
        if not importable(module):
            problems.append(f"no module {module}")
            continue
        problems += [f"{module} has no {a}" for a in attributes if defines(module, a) is False]
    return problems


def report() -> None:
    for name, count in sorted(CALLS.items()):
        print(f"sharedkv-inject: {name} called {count} times", file=sys.stderr, flush=True)


def install(cycles: int | None = None, delay: Callable[[], None] | None = None,
            targets: dict[str, list[str]] | None = None,
            report_at_exit: bool = True) -> post_import.PostImportFinder | None:
    """Wrap the targets (already imported ones now, the rest as they load)."""
    if cycles is None:
        raw = os.environ.get(CYCLES_ENV, "")
        cycles = int(float(raw)) if raw else 0
    if cycles <= 0 and delay is None:
        return None
    chosen = delay or functools.partial(cuda_delay, cycles)
    wanted = targets if targets is not None else parse_targets(os.environ.get(TARGETS_ENV))
    finder = post_import.install(wanted, lambda name, fn: wrap(name, fn, chosen), TAG,
                                 verb="delaying")
    if report_at_exit:
        atexit.register(report)
    print(f"sharedkv-inject: fault-sensitivity mode, {cycles} cycles before each KV transfer",
          file=sys.stderr, flush=True)
    return finder
