"""The one completion request and usage reader the service, replica_pair and perf tiers
share (stack.completions)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_sharedkv.stack.completions import Usage, read_usage, request_body


def test_the_body_is_greedy_and_names_only_what_it_is_given() -> None:
    assert request_body("w00 w01", 8) == {"prompt": "w00 w01", "max_tokens": 8,
                                          "temperature": 0.0}
    assert request_body("p", 4, "salt-1", logprobs=True) == {
        "prompt": "p", "max_tokens": 4, "temperature": 0.0, "logprobs": 1,
        "cache_salt": "salt-1"}


def test_extra_fields_come_last_and_may_override() -> None:
    body = request_body("p", 4, "s", extra={"stop": ["\n"], "temperature": 0.5})
    assert body["stop"] == ["\n"] and body["temperature"] == 0.5
    assert body["cache_salt"] == "s"


@pytest.mark.parametrize(("data", "expected"), [
    ({"usage": {"prompt_tokens": 12, "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 8}}}, Usage(12, 3, 8)),
    ({"usage": {"prompt_tokens": 12, "completion_tokens": 3}}, Usage(12, 3, None)),
    ({"usage": {"prompt_tokens": 12, "prompt_tokens_details": None}}, Usage(12, None, None)),
    ({"usage": {"prompt_tokens": "12", "prompt_tokens_details": {"cached_tokens": 0}}},
     Usage(None, None, 0)),
    ({"usage": None}, Usage()),
    ({}, Usage()),
])
def test_usage_reads_what_the_engine_gave_and_none_for_the_rest(
        data: dict[str, Any], expected: Usage) -> None:
    assert read_usage(data) == expected
