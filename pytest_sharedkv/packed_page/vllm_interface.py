"""``vllm.v1.kv_cache_interface`` for LMCache's hybrid registration code, with or without vLLM.

LMCache's own vLLM glue (``lmcache.integration.vllm.kv_cache_group_edits`` and
``kv_cache_groups``) imports vLLM's KV-cache spec classes. Where vLLM is installed we use
it; elsewhere (CPU CI) a minimal stand-in with vLLM 0.26.0's semantics is put in
``sys.modules`` for the duration of a round trip and removed afterwards, so nothing later
in the run mistakes it for an installed vLLM. The report says which one ran.

Stand-in semantics follow vllm/v1/kv_cache_interface.py (0.26.0): AttentionSpec and
MambaSpec page sizes, KVCacheTensor, KVCacheGroupSpec, KVCacheConfig.has_mamba_layers.
LMCache matches spec classes by name in the MRO, so the names matter.
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod
from typing import Any

import torch

STUB_MARK = "SHAREDKV_STAND_IN"


def _build_stub() -> dict[str, types.ModuleType]:
    class KVCacheSpecKind(str, enum.Enum):
        FULL_ATTENTION = "full_attention"
        MLA_ATTENTION = "mla_attention"
        SLIDING_WINDOW = "sliding_window"
        SLIDING_WINDOW_MLA = "sliding_window_mla"
        MAMBA = "mamba"
        CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
        SINK_FULL_ATTENTION = "sink_full_attention"
        ENCODER_ONLY_ATTENTION = "encoder_only_attention"
        CROSS_ATTENTION = "cross_attention"
        UNKNOWN = "unknown"

    @dataclass(frozen=True)
    class KVCacheSpec:
        block_size: int

    @dataclass(frozen=True, kw_only=True)
    class AttentionSpec(KVCacheSpec):
        num_kv_heads: int
        head_size: int
        dtype: torch.dtype
        page_size_padded: int | None = None

        @property
        def page_size_bytes(self) -> int:
            real = 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize
            return self.page_size_padded if self.page_size_padded is not None else real

    @dataclass(frozen=True, kw_only=True)
    class FullAttentionSpec(AttentionSpec):
        pass

    @dataclass(frozen=True, kw_only=True)
    class MambaSpec(KVCacheSpec):
        shapes: tuple[tuple[int, ...], ...]
        dtypes: tuple[torch.dtype, ...]
        page_size_padded: int | None = None
        mamba_type: Any = None
        mamba_cache_mode: str = "none"
        num_speculative_blocks: int = 0

        @property
        def page_size_bytes(self) -> int:
            real = sum(prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes, strict=True))
            return self.page_size_padded if self.page_size_padded is not None else real

    @dataclass
    class KVCacheTensor:
        size: int
        shared_by: list[str]
        offset: int = 0
        block_stride: int = 0

    @dataclass
    class KVCacheGroupSpec:
        layer_names: list[str]
        kv_cache_spec: KVCacheSpec
        is_eagle_group: bool = False

    @dataclass
    class KVCacheConfig:
        num_blocks: int
        kv_cache_tensors: list[KVCacheTensor]
        kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)

        @property
        def has_mamba_layers(self) -> bool:
            return any(isinstance(g.kv_cache_spec, MambaSpec) for g in self.kv_cache_groups)

    def get_kv_cache_spec_kind(spec: KVCacheSpec) -> KVCacheSpecKind:
        if isinstance(spec, MambaSpec):
            return KVCacheSpecKind.MAMBA
        if isinstance(spec, FullAttentionSpec):
            return KVCacheSpecKind.FULL_ATTENTION
        return KVCacheSpecKind.UNKNOWN

    class MambaAttentionBackendEnum(enum.Enum):
        GDN_ATTN = "vllm.v1.attention.backends.gdn_attn.GDNAttentionBackend"

    modules: dict[str, types.ModuleType] = {}
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        module = types.ModuleType(name)
        module.__path__ = []  # a package
        setattr(module, STUB_MARK, True)
        modules[name] = module
    iface = types.ModuleType("vllm.v1.kv_cache_interface")
    for obj in (KVCacheSpecKind, KVCacheSpec, AttentionSpec, FullAttentionSpec, MambaSpec,
                KVCacheTensor, KVCacheGroupSpec, KVCacheConfig, get_kv_cache_spec_kind):
        obj.__module__ = iface.__name__
        setattr(iface, obj.__name__, obj)
    setattr(iface, STUB_MARK, True)
    registry = types.ModuleType("vllm.v1.attention.backends.registry")
    registry.MambaAttentionBackendEnum = MambaAttentionBackendEnum  # type: ignore[attr-defined]
    setattr(registry, STUB_MARK, True)
    modules[iface.__name__] = iface
    modules[registry.__name__] = registry
    return modules


def _real_vllm() -> str | None:
    """None when vLLM's spec modules import; else why not."""
    try:
        import vllm.v1.attention.backends.registry
        import vllm.v1.kv_cache_interface  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@contextmanager
def kv_cache_interface() -> Iterator[tuple[types.ModuleType, types.ModuleType, str]]:
    """(kv_cache_interface, backends.registry, what it is) for the duration of the block."""
    why = _real_vllm()
    if why is None:
        yield (sys.modules["vllm.v1.kv_cache_interface"],
               sys.modules["vllm.v1.attention.backends.registry"], "vLLM (installed)")
        return
    stub = _build_stub()
    saved = {name: sys.modules.get(name) for name in stub}
    sys.modules.update(stub)
    try:
        yield (stub["vllm.v1.kv_cache_interface"], stub["vllm.v1.attention.backends.registry"],
               "sharedkv stand-in for vllm.v1.kv_cache_interface (vLLM not importable)")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        # LMCache's glue modules imported the stand-in; drop them so a later import sees the
        # truth (they are re-imported, with the stand-in again, by the next round trip).
        for name in [n for n in sys.modules if n.startswith("lmcache.integration.vllm")]:
            del sys.modules[name]
