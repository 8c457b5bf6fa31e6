"""What an engine's own KV offloading (vLLM's OffloadingConnector: the NATIVE arm) moved:
the bytes it stored to its CPU tier and loaded back, summed over the "KV Transfer metrics"
lines vLLM logs (one per stats interval, each interval's own counts). It says why NATIVE
cross-replica requests find nothing (a replica's tier serves only its own engine) and
whether its local hits came from the tier or from the GPU's prefix cache. Reported only,
never judged: a log with no such line is unknown (logging off, another vLLM), not 0."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# vLLM 0.26: "KV Transfer metrics: vllm:kv_offload_store_bytes=1335492608, ..." (a counter
# appears in an interval's line only when it moved in that interval)
LINE = re.compile(r"KV Transfer metrics: (.*)$", re.MULTILINE)
PAIR = re.compile(r"(vllm:kv_offload_[a-z_]+)=([0-9.eE+-]+)")
STORED = "vllm:kv_offload_store_bytes"
LOADED = "vllm:kv_offload_load_bytes"
FIELDS = {STORED: "stored_bytes", LOADED: "loaded_bytes"}


def offload_traffic(log: str) -> dict[str, float] | None:
    """``{"stored_bytes", "loaded_bytes", "intervals"}`` over LOG's offloading lines, or
    None where LOG has none (the engine offloads nothing, or does not log it: unknown)."""
    totals = dict.fromkeys(FIELDS.values(), 0.0)
    intervals = 0
    for line in LINE.findall(log):
        pairs = PAIR.findall(line)
        if not pairs:  # another connector's metrics (LMCache's), not the offloading one's
            continue
        intervals += 1
        for name, value in pairs:
            if name in FIELDS:
                totals[FIELDS[name]] += float(value)
    if not intervals:
        return None
    return {**totals, "intervals": float(intervals)}


def _bytes(value: float) -> str:
    return f"{value / 1e9:.1f} GB" if value >= 1e8 else f"{value:,.0f} B"


def traffic_note(launches: Sequence[Mapping[str, object]]) -> str | None:
    """One line for the report: each block's offload traffic per replica
    (``perf.launches[].offload``); None where no block recorded any."""
    blocks, loaded = [], 0.0
    for index, launch in enumerate(launches):
        traffic = launch.get("offload")
        if not isinstance(traffic, Mapping) or not traffic:
            continue
        parts = []
        for replica, t in traffic.items():
            if not isinstance(t, Mapping):
                continue
            parts.append(f"{replica} stored {_bytes(float(t['stored_bytes']))}, loaded "
                         f"{_bytes(float(t['loaded_bytes']))} ({int(t['intervals'])} "
                         "intervals logged)")
            loaded += float(t["loaded_bytes"])
        if parts:
            blocks.append(f"block {index} ({launch.get('arm', '?')}): {'; '.join(parts)}")
    if not blocks:
        return None
    why = ("; nothing was loaded back: every hit was the engine's own GPU prefix cache, "
           "and a replica's offload tier serves only its own engine" if loaded == 0 else "")
    return ("offload tier (vLLM's KV Transfer metrics as its log states them, each stats "
            "interval's own counts summed; an interval cut short by the stop is not "
            "logged): " + " | ".join(blocks) + why)


def logged_traffic(logs: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Each process's offload traffic from its log (process name -> log text); a process
    whose log states none is left out (unknown)."""
    found = {name: offload_traffic(text) for name, text in logs.items()}
    return {name: traffic for name, traffic in found.items() if traffic is not None}
