"""Fault-sensitivity mode: a delay kernel on the current stream before every KV store and
retrieve, in the processes the suite launches (LMCache server and engines).

A stream-ordering bug in a copy path is latent when the producer finishes before anyone
looks; an imposed delay makes it a deterministic wrong answer. The launched processes get
``SHAREDKV_INJECT_DELAY_CYCLES`` and ``inject/`` on ``PYTHONPATH``; its
``sitecustomize`` calls :func:`install`, which wraps the target functions as their modules
load (a post-import hook), so nothing is imported early. Each wrapped call counts itself;
the counts are printed at exit, so a run can show the hook was actually hit.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

CYCLES_ENV = "SHAREDKV_INJECT_DELAY_CYCLES"
TARGETS_ENV = "SHAREDKV_INJECT_TARGETS"
# LMCache 0.5.6 entry points of KV stores and retrieves (server object groups, the GPU
# connector helpers, the engine-driven worker path).
DEFAULT_TARGETS = (
    "lmcache.v1.multiprocess.object_group_transfer:transfer_kv_per_object_group",
    "lmcache.v1.gpu_connector.gpu_ops:lmcache_memcpy_async_d2h",
    "lmcache.v1.gpu_connector.gpu_ops:lmcache_memcpy_async_h2d",
    "lmcache.v1.multiprocess.transfer_context.base:gather_paged_kv_to_cpu",
    "lmcache.v1.multiprocess.transfer_context.base:scatter_cpu_to_paged_kv",
)
CALLS: Counter[str] = Counter()


def cuda_delay(cycles: int) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda._sleep(cycles)


def wrap(name: str, fn: Callable[..., Any], delay: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def delayed(*args: Any, **kwargs: Any) -> Any:
        CALLS[name] += 1
        delay()
        return fn(*args, **kwargs)

    delayed.__sharedkv_delayed__ = True  # type: ignore[attr-defined]
    return delayed


def patch_module(module: ModuleType, attributes: Sequence[str],
                 delay: Callable[[], None]) -> list[str]:
    patched = []
    for attribute in attributes:
        fn = getattr(module, attribute, None)
        if callable(fn) and not getattr(fn, "__sharedkv_delayed__", False):
            name = f"{module.__name__}:{attribute}"
            setattr(module, attribute, wrap(name, fn, delay))
            patched.append(name)
    return patched


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, attributes: Sequence[str],
                 delay: Callable[[], None]) -> None:
        self.inner = inner
        self.attributes = attributes
        self.delay = delay

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        for name in patch_module(module, self.attributes, self.delay):
            print(f"sharedkv-inject: delaying {name}", file=sys.stderr, flush=True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, targets: dict[str, list[str]], delay: Callable[[], None]) -> None:
        self.targets = targets
        self.delay = delay

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if find is not None else None)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.targets[fullname], self.delay)
                return spec
        return None


def parse_targets(text: str | None) -> dict[str, list[str]]:
    targets: dict[str, list[str]] = {}
    for item in (text.split(",") if text else DEFAULT_TARGETS):
        module, _, attribute = item.strip().partition(":")
        if module and attribute:
            targets.setdefault(module, []).append(attribute)
    return targets


def report() -> None:
    for name, count in sorted(CALLS.items()):
        print(f"sharedkv-inject: {name} called {count} times", file=sys.stderr, flush=True)


def install(cycles: int | None = None, delay: Callable[[], None] | None = None,
            targets: dict[str, list[str]] | None = None,
            report_at_exit: bool = True) -> _PostImportFinder | None:
    """Wrap the targets (already imported ones now, the rest as they load)."""
    if cycles is None:
        raw = os.environ.get(CYCLES_ENV, "")
        cycles = int(float(raw)) if raw else 0
    if cycles <= 0 and delay is None:
        return None
    chosen = delay or functools.partial(cuda_delay, cycles)
    wanted = targets if targets is not None else parse_targets(os.environ.get(TARGETS_ENV))
    for module_name, attributes in wanted.items():
        loaded = sys.modules.get(module_name)
        if loaded is not None:
            patch_module(loaded, attributes, chosen)
    finder = _PostImportFinder(wanted, chosen)
    sys.meta_path.insert(0, finder)
    if report_at_exit:
        atexit.register(report)
    print(f"sharedkv-inject: fault-sensitivity mode, {cycles} cycles before each KV transfer",
          file=sys.stderr, flush=True)
    return finder
