"""The markers the plugin registers, with signatures, so ``--strict-markers`` runs stay clean.

Tier markers select what users run (``pytest -m ordering``); the two ``sharedkv_*``
markers state what a test needs, and the plugin turns an unmet need into a precise skip
(or, with ``--sharedkv-require-gpu``, a failure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import pytest

TIER_MARKERS: dict[str, str] = {
    "ordering": "copy paths honour the current CUDA stream (byte probes under an imposed delay)",
    "packed_page": "every byte of every KV layout survives a cross-replica round trip",
    "pinned_pool": "the full host pool is really pinned, with the size that was asked",
    "replica_pair": "two replicas over one shared LMCache pool (launcher, hits, teardown)",
    "service_regression": "exact answers and hit accounting: cold / local / cross / receiver-local",
    "identity": "everything that changes KV partitions the key: per stack and dimension "
                "(salt, adapter, weights, RoPE, kv dtype, chunk, release, restart) the same "
                "identity hits and another does not, or answers exactly",
    "perf": "locality performance in OFF-ON-ON-OFF blocks (or OFF-NATIVE, OFF-ON-NATIVE) "
            "with payload-matched pairs",
}

GPU_MARKER = "sharedkv_gpu"
REQUIRES_MARKER = "sharedkv_requires"

MARKER_LINES: tuple[str, ...] = (
    *(f"{name}: sharedkv tier - {doc}" for name, doc in TIER_MARKERS.items()),
    f"{GPU_MARKER}(count=1, min_free_gib=None): needs COUNT CUDA devices (each with at least "
    "MIN_FREE_GIB GiB free); leased per test, exclusive across xdist workers; skipped with the "
    "reason when absent, failed instead under --sharedkv-require-gpu",
    f"{REQUIRES_MARKER}(*distributions): needs these importable (e.g. 'lmcache', 'vllm'); "
    "skipped with the import error when absent, failed under --sharedkv-require-gpu",
)


def register(config: pytest.Config) -> None:
    for line in MARKER_LINES:
        config.addinivalue_line("markers", line)


class MarkerError(ValueError):
    """A sharedkv marker with arguments outside its signature."""


@dataclass(frozen=True)
class GpuNeed:
    count: int
    min_free_gib: float | None


def gpu_need(item: pytest.Item) -> GpuNeed | None:
    """What the closest ``sharedkv_gpu`` marker asks for, validated."""
    marker = item.get_closest_marker(GPU_MARKER)
    if marker is None:
        return None
    return _gpu_need_from_marker(marker, item.nodeid)


def _gpu_need_from_marker(marker: pytest.Mark, nodeid: str) -> GpuNeed:
    def _signature(count: int = 1, min_free_gib: float | None = None) -> GpuNeed:
        return GpuNeed(count, min_free_gib)

    try:
        need = _signature(*marker.args, **marker.kwargs)
    except TypeError as exc:
        raise MarkerError(
            f"{nodeid}: @pytest.mark.{GPU_MARKER} takes (count=1, min_free_gib=None): {exc}"
        ) from None
    if not isinstance(need.count, int) or need.count < 1:
        raise MarkerError(f"{nodeid}: {GPU_MARKER}(count=...) must be an int >= 1")
    if need.min_free_gib is not None and not (
        isinstance(need.min_free_gib, (int, float)) and need.min_free_gib > 0
    ):
        raise MarkerError(f"{nodeid}: {GPU_MARKER}(min_free_gib=...) must be a number > 0")
    return need


def required_distributions(item: pytest.Item) -> tuple[str, ...]:
    names: list[str] = []
    for marker in item.iter_markers(REQUIRES_MARKER):
        for arg in marker.args:
            if not isinstance(arg, str) or not arg:
                raise MarkerError(
                    f"{item.nodeid}: @pytest.mark.{REQUIRES_MARKER} takes module names as strings"
                )
            if arg not in names:
                names.append(arg)
    return tuple(names)


NOT_ASKED = pytest.StashKey[str]()  # why a gated test skipped by choice, not for hardware


def skip_not_asked(node: pytest.Item, reason: str) -> NoReturn:
    """Skip a gated test because its option is off or it has nothing to do (the triage
    of a pair that answered right): no missing GPU, lmcache or vLLM, so
    --sharedkv-require-gpu keeps it a skip."""
    node.stash[NOT_ASKED] = reason
    raise pytest.skip.Exception(reason, _use_item_location=True)  # reported at the test


def is_gated(item: pytest.Item) -> bool:
    """True for tests whose skips --sharedkv-require-gpu must turn into failures."""
    return NOT_ASKED not in item.stash and (
        item.get_closest_marker(GPU_MARKER) is not None
        or item.get_closest_marker(REQUIRES_MARKER) is not None
    )
