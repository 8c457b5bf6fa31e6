"""What SGLang 0.5.17 says, read into the suite's shape, for a launched SGLang pair and for
the stub double that answers as SGLang does: its ``/metrics`` (``sglang_counters``: cached
tokens by ``cache_source``), an answer's usage (``sglang_answer``) and the record's
``stack`` (``engine_fact``). Imports no provider and no launcher."""

from __future__ import annotations

from typing import Any

from pytest_sharedkv.stack.metrics import EXTERNAL_HITS, LOCAL_HITS, parse_counters

SGLANG_VERSION = "0.5.17"  # the release whose LMCache path this module is written for
CACHED = "sglang:cached_tokens"  # sglang:cached_tokens_total{cache_source=...}
LOCAL_SOURCES = frozenset({"device"})  # SGLang's radix cache on the GPU
# what LMCRadixCache's init_load_back loaded (host_hit_length; storage_* is HiCache's L3)
EXTERNAL_SOURCES = ("host", "storage_")
KV_AUDIT = ("n/a: the KV audit's hook wraps vLLM's MP connector; SGLang 0.5.17's "
            "LMCacheMPConnector registers its pools through CUDA IPC and has no hook here")


def sglang_counters(text: str) -> dict[str, float]:
    """SGLang's /metrics read into the suite's counter names: LOCAL_HITS the cached tokens
    from ``device``, EXTERNAL_HITS those from ``host`` and ``storage_*``; both only where
    SGLang exports the family (``--enable-metrics``), else absent: unknown, not zero."""
    from prometheus_client.parser import text_string_to_metric_families

    found = parse_counters(text)
    local = external = 0.0
    seen = False
    try:
        for family in text_string_to_metric_families(text):
            if family.name.removesuffix("_total") != CACHED:
                continue
            seen = True
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                source = sample.labels.get("cache_source", "")
                if source in LOCAL_SOURCES:
                    local += float(sample.value)
                elif source.startswith(EXTERNAL_SOURCES):
                    external += float(sample.value)
    except ValueError:
        return found
    if seen:
        found[LOCAL_HITS], found[EXTERNAL_HITS] = local, external
    return found


def sglang_answer(data: dict[str, Any]) -> dict[str, Any]:
    """An SGLang answer in vLLM's shape: with ``--enable-cache-report`` SGLang leaves
    ``prompt_tokens_details`` out when nothing was cached (0.5.17's
    ``UsageProcessor._details_if_cached``); that is 0 cached tokens. An answer without
    usage stays without it (unknown)."""
    usage = data.get("usage")
    if not isinstance(usage, dict) or usage.get("prompt_tokens_details") is not None:
        return data
    return {**data, "usage": {**usage, "prompt_tokens_details": {"cached_tokens": 0}}}


def engine_fact(version: str | None) -> dict[str, Any]:
    """The record's ``stack`` for an SGLang pair (the real one, or the stub's model of it)."""
    return {"engine": "sglang", "engine_version": version, "connector": "LMCRadixCache",
            "backend": "LMCache MP server", "kv_audit": KV_AUDIT}
