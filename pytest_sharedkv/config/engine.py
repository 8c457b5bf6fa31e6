"""Which serving engine a pair's replicas run (``--sharedkv-engine``): vLLM, the default,
or SGLang over LMCache's MP server (``stack/launch/sglang_engine.py``). One typed value, chosen
here; what cannot run with it is said before any test (``config/combinations.py``).

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
