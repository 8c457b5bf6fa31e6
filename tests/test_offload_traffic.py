"""``stack.offload_traffic``: what vLLM's own offloading moved, read from the lines vLLM 0.26
logged on the H200 (the NATIVE block of ``perf-27b-compiled-native1``), and the report's
line."""

from __future__ import annotations

from pytest_sharedkv.stack.offload_traffic import logged_traffic, offload_traffic, traffic_note
from tests.h200_logs import H200, sections

LOG = H200 / "perf-27b-compiled-native1-engines.log"


def _sections() -> dict[str, str]:
    return sections(LOG)


def test_a_native_engine_stored_to_its_cpu_tier_and_never_loaded() -> None:
    """On the H200 both NATIVE engines wrote 37-43 GB to their 32 GB tiers and read nothing
    back: their local hits were the GPU prefix cache, and B cannot read A's tier."""
    logs = _sections()
    a = offload_traffic(logs["NATIVE-668153819729/vllm-A-50519.log"])
    b = offload_traffic(logs["NATIVE-668153819729/vllm-B-47485.log"])
    assert a == {"stored_bytes": 42_836_951_040.0, "loaded_bytes": 0.0, "intervals": 11.0}
    assert b == {"stored_bytes": 37_084_332_032.0, "loaded_bytes": 0.0, "intervals": 11.0}


def test_no_offloading_line_is_unknown_not_zero() -> None:
    start = (H200 / "perf-27b-compiled-s2-engine-start.log").read_text()
    assert offload_traffic(start) is None  # an engine without the offloading connector
    other = "INFO [metrics.py:103] KV Transfer metrics: lmcache:num_hit_tokens=12"
    assert offload_traffic(other) is None  # another connector's metrics
    assert logged_traffic({"vllm replica A": start}) == {}


def test_loads_and_stores_sum_over_intervals() -> None:
    log = ("KV Transfer metrics: vllm:kv_offload_store_bytes=100, vllm:kv_offload_store_time=0.1\n"
           "KV Transfer metrics: vllm:kv_offload_load_bytes=2.5e3\n"
           "KV Transfer metrics: vllm:kv_offload_cpu_cache_usage_perc=0.0\n")
    assert offload_traffic(log) == {"stored_bytes": 100.0, "loaded_bytes": 2500.0,
                                    "intervals": 3.0}


def test_the_report_line() -> None:
    logs = _sections()
    traffic = logged_traffic({"vllm replica A": logs["NATIVE-668153819729/vllm-A-50519.log"],
                              "vllm replica B": logs["NATIVE-668153819729/vllm-B-47485.log"]})
    launches: list[dict[str, object]] = [{"arm": "OFF", "processes": []},
                                         {"arm": "NATIVE", "offload": traffic}]
    note = traffic_note(launches)
    assert note is not None
    assert ("block 1 (NATIVE): vllm replica A stored 42.8 GB, loaded 0 B (11 intervals "
            "logged); vllm replica B stored 37.1 GB, loaded 0 B (11 intervals logged)") in note
    assert note.endswith("a replica's offload tier serves only its own engine")
    launches[1]["offload"] = {"vllm replica A": {"stored_bytes": 1e9, "loaded_bytes": 5e8,
                                                 "intervals": 2}}
    note = traffic_note(launches)
    assert note is not None and "loaded 0.5 GB" in note and "nothing was loaded" not in note
    assert traffic_note([{"arm": "OFF", "processes": []}]) is None  # an older report
