"""Where each LMCache release keeps what the tiers call, found by looking, not by version.

LMCache moves names between releases (0.5.6's ``lmcache.lmcache_native.TransferDirection``
is 0.5.3's ``lmcache.c_ops.TransferDirection``; 0.5.6's ``object_group_transfer`` module
holds what 0.5.3 keeps in ``modules.lmcache_driven_transfer``). Each entry of ``PLACES``
lists the candidates, newest first; the first that imports wins. A release that has none
of them raises ``MissingLMCacheAPI`` naming every place looked in, which a tier turns into
a VOID result, never a traceback from deep inside a round trip.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

PLACES: dict[str, tuple[str, ...]] = {
    "TransferDirection": ("lmcache.lmcache_native:TransferDirection",
                          "lmcache.c_ops:TransferDirection"),
    "fallback lmcache_memcpy_async": (
        "lmcache.v1.platform.torch_ops:mem_kernels.lmcache_memcpy_async",
        "lmcache.v1.platform.torch_ops:lmcache_memcpy_async"),
    "transfer_kv_per_object_group": (
        "lmcache.v1.multiprocess.object_group_transfer:transfer_kv_per_object_group",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer:transfer_kv_per_object_group"),
    "downsample_and_stage_block_ids": (
        "lmcache.v1.multiprocess.object_group_transfer:downsample_and_stage_block_ids",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer:"
        "downsample_and_stage_block_ids"),
    "get_layout_desc": (  # the same place in both; its module needs native_storage_ops
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer:get_layout_desc",),
    "CPUCacheContext": ("lmcache.v1.platform.devices.cpu.cache_context:CPUCacheContext",
                        "lmcache.v1.platform.cpu.cache_context:CPUCacheContext"),
}


class MissingLMCacheAPI(LookupError):
    """This LMCache has none of the places a name is known to live in."""

    def __init__(self, what: str, tried: list[str]) -> None:
        self.what = what
        self.tried = tried
        super().__init__(f"LMCache {_version()} has no {what} (looked in: {'; '.join(tried)})")


def _version() -> str:
    try:
        import lmcache
    except Exception:  # not importable at all: say so in the message, not here
        return "(not importable)"
    return str(getattr(lmcache, "__version__", "?"))


def _lookup(place: str) -> Any:
    module_name, _, path = place.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def where(what: str, places: tuple[str, ...] | None = None) -> str:
    """The first of WHAT's places (``module:attr``) this LMCache has."""
    tried = []
    for place in places if places is not None else PLACES[what]:
        try:
            _lookup(place)
        except Exception as exc:  # absent, or a module whose own import fails here
            tried.append(f"{place} ({type(exc).__name__}: {exc})")
            continue
        return place
    raise MissingLMCacheAPI(what, tried)


def resolve(what: str, places: tuple[str, ...] | None = None) -> Any:
    """WHAT from the first of its places this LMCache has."""
    return _lookup(where(what, places))


def direction(name: str) -> Any:
    """LMCache's ``TransferDirection.NAME`` (D2H or H2D) as its own callers pass it."""
    return getattr(resolve("TransferDirection"), name)


def accepts(function: Any, name: str) -> bool:
    """Whether FUNCTION names a parameter NAME (0.5.3's functions lack some of 0.5.6's);
    an unreadable signature (a compiled binding) names none."""
    from inspect import signature

    try:
        return name in signature(function).parameters
    except (TypeError, ValueError):
        return False


def known_keywords(function: Any, **keywords: Any) -> dict[str, Any]:
    """Those of KEYWORDS that FUNCTION takes: an argument a release added is passed only to
    the releases that have it."""
    return {name: value for name, value in keywords.items() if accepts(function, name)}


# What a stack imports from LMCache that a release may have moved (issue 50 item 3): the
# in-process stack's LMCacheConnectorV1 in vLLM 0.26 imports these places, 0.5.6's; each
# maps to where 0.5.7rc2 keeps it (moved under lmcache.inprocess, no shim left behind).
STACK_MODULES: dict[str, tuple[str, ...]] = {
    "inprocess": ("lmcache.integration.vllm.vllm_v1_adapter", "lmcache.v1.cache_engine",
                  "lmcache.v1.manager"),
}
MOVED_MODULES: dict[str, str] = {
    "lmcache.integration.vllm.vllm_v1_adapter":
        "lmcache.inprocess.integration.vllm.vllm_v1_adapter",
    "lmcache.v1.cache_engine": "lmcache.inprocess.v1.cache_engine",
    "lmcache.v1.manager": "lmcache.inprocess.v1.manager",
}


def module_file(lmcache_dir: Path, module: str) -> Path | None:
    """Where MODULE's source (or package) lies under the LMCache package at LMCACHE_DIR,
    found on disk (nothing imported: importing LMCache pulls in torch); None if absent."""
    parts = module.split(".")[1:]
    base = lmcache_dir.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def release_of(lmcache_dir: Path) -> str:
    """The release of the LMCache package at LMCACHE_DIR, from its _version.py or the
    dist-info beside it; "(version unknown)" where neither says."""
    import re

    version = lmcache_dir / "_version.py"
    if version.is_file():
        found = re.search(r"^__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)",
                          version.read_text(errors="replace"), re.M)
        if found:
            return found.group(1)
    for info in sorted(lmcache_dir.parent.glob("lmcache-*.dist-info")):
        return info.name.removeprefix("lmcache-").removesuffix(".dist-info")
    return "(version unknown)"


def stack_refusal(stack: str, lmcache_dir: Path) -> str | None:
    """Why the LMCache at LMCACHE_DIR cannot drive STACK (a module it imports is not
    there; where the release keeps it now, where known), or None."""
    missing = [m for m in STACK_MODULES.get(stack, ()) if module_file(lmcache_dir, m) is None]
    if not missing:
        return None
    said = []
    for module in missing:
        moved = MOVED_MODULES.get(module)
        if moved is not None and module_file(lmcache_dir, moved) is not None:
            said.append(f"{module} moved to {moved}")
        else:
            said.append(f"{module} is not there")
    return (f"LMCache {release_of(lmcache_dir)} ({lmcache_dir}) cannot drive the {stack} "
            f"stack: {'; '.join(said)} (vLLM 0.26's LMCacheConnectorV1 imports the old "
            "place, and the release left no shim)")
