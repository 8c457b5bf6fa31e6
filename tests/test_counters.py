"""Replica counters are read with prometheus_client's own text parser: timestamps, labels,
escapes and comments are Prometheus's business, not a hand-written split."""

from __future__ import annotations

from pytest_sharedkv.stack.metrics import EXTERNAL_HITS, LOCAL_HITS, parse_counters

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


def test_an_unread_or_missing_before_is_no_zero() -> None:
    from pytest_sharedkv.stack.metrics import counter_delta

    after = {LOCAL_HITS: 192.0}
    assert counter_delta({LOCAL_HITS: 96.0}, after, LOCAL_HITS) == 96
    assert counter_delta(None, after, LOCAL_HITS) is None  # the scrape failed
    assert counter_delta({}, after, LOCAL_HITS) is None  # not after[...] - 0
    assert counter_delta({LOCAL_HITS: 96.0}, None, LOCAL_HITS) is None


def test_a_failed_scrape_before_a_request_leaves_its_hits_unknown() -> None:
    from pytest_sharedkv.stack.pair import Replica
    from tests.stub_endpoints import external_stubs

    with external_stubs("--fail-metrics", "5") as urls:
        replica = Replica("A", urls.split(",")[0])
        prompt = "scrape " * 100
        replica.complete(prompt, 4, "s")  # scrapes 1, 2: cold
        replica.complete(prompt, 4, "s")  # scrapes 3, 4: 96 local hit tokens
        third = replica.complete(prompt, 4, "s")  # scrape 5 (before) fails
    assert not third.counters_read
    assert third.local_hit_tokens is None  # not 192, the engine's cumulative total
    assert third.external_hit_tokens is None
    assert third.cached_tokens == 96  # usage still reports the request's own
