"""The Prometheus counters the suite reads from an engine or a server: the text parsed into
totals, the delta between two reads (unknown, never 0, where a read failed or lacks the
counter), and the names of vLLM's hit counters."""

from __future__ import annotations

LOCAL_HITS = "vllm:prefix_cache_hits"


EXTERNAL_HITS = "vllm:external_prefix_cache_hits"


def parse_counters(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name without _total: value summed over labels}.

    prometheus_client's own parser reads it (a sample's optional timestamp is not its value;
    label values may hold spaces and braces); text that stops parsing yields what came before.
    """
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")
                totals[name] = totals.get(name, 0.0) + float(sample.value)
    except ValueError:
        pass
    return totals


Counters = dict[str, float]


def counter_delta(before: Counters | None, after: Counters | None, name: str
                  ) -> int | None:
    """How much counter NAME grew between two reads; None when that is unknown: a read
    failed (None), or either read lacks the counter (the engine has none). A missing
    "before" is never 0: one failed scrape would credit the engine's cumulative total."""
    if before is None or after is None or name not in after or name not in before:
        return None
    return int(after[name] - before[name])


def counters_read(*reads: Counters | None) -> bool:
    """Every one of these metrics reads succeeded."""
    return all(read is not None for read in reads)
