"""Which serving engine a pair's replicas run (``--sharedkv-engine``): vLLM, the default,
or SGLang over LMCache's MP server (``stack/sglang_engine.py``). One typed value, chosen
here; what cannot run with it is said before any test.

SGLang 0.5.17 reaches LMCache through ``sglang/srt/mem_cache/storage/lmcache/
lmc_radix_cache.py``, which imports three modules of ``lmcache.integration.sglang``
(``multi_process_adapter``, ``sglang_adapter``, ``utils``) when the radix cache is built,
inside the engine: present in LMCache 0.5.6, gone in 0.5.7rc2. Whether they are there is
read with ``importlib.util.find_spec`` alone: the plugin never imports SGLang or LMCache
to decide it.
"""

from __future__ import annotations

import importlib.util
from enum import Enum
from typing import TYPE_CHECKING

from pytest_sharedkv.config.provider import Provider
from pytest_sharedkv.config.stack_choice import ATTENTION_ONLY_HINT, _config, is_hybrid

if TYPE_CHECKING:
    from pytest_sharedkv.config.options import Settings


class Engine(str, Enum):
    """The engine in each replica (a ``str``: JSON and f-strings show the name)."""

    VLLM = "vllm"
    SGLANG = "sglang"

    def __str__(self) -> str:
        return self.value


ENGINE_NAMES: tuple[str, ...] = tuple(e.value for e in Engine)
# what SGLang 0.5.17's lmc_radix_cache.py imports from LMCache (its lines 23-30)
SGLANG_LMCACHE_MODULES = ("lmcache.integration.sglang.multi_process_adapter",
                          "lmcache.integration.sglang.sglang_adapter",
                          "lmcache.integration.sglang.utils")
SGLANG_MODULES = ("sglang", "sgl_kernel")  # the server, and the kernels it imports at start


def _absent(name: str) -> bool:
    """Whether module NAME cannot be found (a parent that is absent counts as absent)."""
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def sglang_missing() -> str | None:
    """What a launched SGLang pair lacks here, named, or None: SGLang itself, its kernels,
    or the LMCache modules SGLang's LMCache radix cache imports."""
    missing = [name for name in SGLANG_MODULES if _absent(name)]
    if missing:
        return (f"{' and '.join(missing)} not importable: a launched SGLang pair needs "
                "SGLang 0.5.17 and its sgl_kernel (PyPI sglang, sglang-kernel)")
    lmcache = [name for name in SGLANG_LMCACHE_MODULES if _absent(name)]
    if lmcache:
        return (f"{', '.join(lmcache)} not importable: SGLang 0.5.17's LMCache radix cache "
                "(lmc_radix_cache.py) imports them when the engine starts; LMCache 0.5.6 "
                "has them, 0.5.7rc2 deleted them")
    return None


def engine_problem(settings: Settings, provider: Provider) -> str | None:
    """Why ``--sharedkv-engine sglang`` cannot run with the other settings or here, or
    None. PROVIDER: the one asked for (``auto`` resolved as far as the settings say)."""
    if settings.engine is Engine.VLLM:
        return None
    where = f"{settings.source_of('engine')} {settings.engine}"
    if settings.stack != "mp":
        return (f"{where}: SGLang reaches LMCache through its MP server alone "
                f"(lmc_radix_cache.py's MP mode), and {settings.source_of('stack')} is "
                f"{settings.stack} (vLLM's own connectors); drop one of them")
    if settings.topology != "shared":
        return (f"{where}: {settings.source_of('topology')} {settings.topology} is not "
                "written for SGLang replicas yet (one MP server both share); drop one of them")
    if settings.triage or settings.fault_catalogue is not None:
        named = settings.source_of("triage" if settings.triage else "fault_catalogue")
        return (f"{where}: {named}'s cells are judged against vLLM's connector logs; "
                "drop one of them")
    if settings.kv_audit and settings.sources.get("kv_audit", "default") != "default":
        return (f"{where}: {settings.source_of('kv_audit')}: the KV audit's hook wraps "
                "vLLM's MP connector; SGLang's connector has no such hook, so the audit is "
                "n/a on SGLang; drop one of them")
    if settings.vllm_args and settings.sources.get("vllm_args", "default") != "default":
        return (f"{where}: {settings.source_of('vllm_args')} gives flags for `vllm serve`, "
                "which an SGLang pair does not run; drop one of them")
    if provider in (Provider.VLLM, Provider.AUTO):
        missing = sglang_missing()
        if missing is not None:
            return (f"{where}: {missing}; or give --sharedkv-provider stub (the test double "
                    "answers as SGLang does) or --sharedkv-endpoints")
        if settings.model is not None:
            config = _config(settings.model)
            if config is not None and is_hybrid(config):
                return (f"{where}: {settings.source_of('model')} {settings.model} is a hybrid "
                        "model, for which SGLang 0.5.17 builds no LMCache radix cache "
                        "(srt/mem_cache/registry.py picks its unified radix cache first), so "
                        "--enable-lmcache would share nothing; " + ATTENTION_ONLY_HINT)
    return None
