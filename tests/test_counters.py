"""Replica counters are read with prometheus_client's own text parser: timestamps, labels,
escapes and comments are Prometheus's business, not a hand-written split."""

from __future__ import annotations

from pytest_sharedkv.stack.pair import EXTERNAL_HITS, LOCAL_HITS, parse_counters

# What vLLM serves (through prometheus_client), one sample with a timestamp.
EXPOSITION = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0 1712345678000
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5.0
# HELP vllm:prefix_cache_hits_created Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_created gauge
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="a \\"quoted\\" {name} 7"} 2976.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 1.0
"""


def test_timestamped_samples_are_values_not_timestamps() -> None:
    counters = parse_counters(EXPOSITION)
    assert counters[LOCAL_HITS] == 15.0  # summed over labels; the timestamp is no value
    assert counters[EXTERNAL_HITS] == 2976.0  # braces and a number inside a label value
    assert counters["vllm:num_requests_running"] == 1.0
    assert not any(name.endswith("_total") for name in counters)


def test_what_the_stub_serves() -> None:
    assert parse_counters("vllm:prefix_cache_hits_total 3\nvllm:prefix_cache_queries_total 9\n"
                          ) == {LOCAL_HITS: 3.0, "vllm:prefix_cache_queries": 9.0}


def test_garbage_is_no_counters() -> None:
    assert parse_counters("<html>not metrics</html>\n") == {}
