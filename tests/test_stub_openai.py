"""The stub test double's pieces (stack.stub_openai), each on its own and served in-process:
what it answers is what the suite's CPU self-tests stand on."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.stack.stub import stub_openai as stub

COPY_PROMPT = " ".join(f"w{i % 100:02d}" for i in range(70))


def _prefill(**overrides: Any) -> stub._Prefill:
    fields: dict[str, Any] = {"words": ["a", "b"], "tokens": ["a", "b"], "copy": False,
                              "block": 16, "local": 0, "external": 0, "stored": [], "done": 1}
    return stub._Prefill(**{**fields, **overrides})


def test_a_stop_string_ends_the_answer_before_the_word_that_completes_it() -> None:
    assert stub._apply_stop(["a", "b", "c"], ["b"]) == (["a"], "stop")
    assert stub._apply_stop(["a", "b", "c"], ["x", "c"]) == (["a", "b"], "stop")
    assert stub._apply_stop(["a", "b"], ["x"]) == (["a", "b"], "length")
    assert stub._apply_stop(["a", "b"], []) == (["a", "b"], "length")


def test_usage_counts_the_prompt_the_answer_and_the_hits() -> None:
    pre = _prefill(tokens=["<s>", "w00", "w01"], local=16, external=32)
    assert pre.cached == 48 and pre.loaded == range(1, 3)
    assert stub._usage(pre, ["x", "y"]) == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 48}}


def test_a_choice_carries_logprobs_only_when_asked() -> None:
    plain = stub._choice({}, ["x", "y"], "length", copy=False)
    assert plain == {"index": 0, "text": " x y", "finish_reason": "length"}
    asked = stub._choice({"logprobs": 1}, ["x", "y"], "stop", copy=False)
    assert asked["logprobs"]["token_logprobs"] == [0.0, 0.0]
    assert asked["logprobs"]["tokens"] == [" x", " y"]


def test_corrupt_external_changes_only_answers_that_hit_the_pool(tmp_path: Path) -> None:
    state = stub._State(stub.parse_args(["--port", "0", "--corrupt-external"]))
    cold = stub._answer_words(state, "some prompt", 4, _prefill(), [])
    assert cold == stub._continuation("some prompt", 4)
    hit = stub._answer_words(state, "some prompt", 4, _prefill(external=16), [])
    assert hit != cold


@contextmanager
def served(*argv: str) -> Iterator[str]:
    args = stub.parse_args(["--port", "0", *argv])
    server = stub._Server(("127.0.0.1", 0), stub.make_handler(stub._State(args)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["X-Sharedkv-Test-Double"] == "1"
        data: dict[str, Any] = json.loads(response.read())
    return data


def _get(url: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + path, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_served_stub_counts_a_repeat_as_local_hits_in_usage_and_metrics() -> None:
    with served() as url:
        body = {"prompt": COPY_PROMPT, "max_tokens": 4, "cache_salt": "s"}
        cold, warm = _post(url, body), _post(url, body)
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # 2 blocks of 32
        assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
        assert cold["usage"]["completion_tokens"] == 4
        status, metrics = _get(url, "/metrics")
        assert status == 200 and "vllm:prefix_cache_hits_total 64" in metrics
        assert _get(url, "/health")[0] == 200


def test_the_served_stub_refuses_a_salt_with_a_slash_and_fails_scrapes_it_is_told_to(
        ) -> None:
    with served("--fail-metrics", "1") as url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(url, {"prompt": "x", "cache_salt": "a/b"})
        assert refused.value.code == 400
        assert _get(url, "/metrics")[0] == 503
        assert _get(url, "/metrics")[0] == 200
        assert _get(url, "/nowhere")[0] == 404


def test_the_served_stub_streams_the_same_answer_with_usage_last() -> None:
    with served() as url:
        body = {"prompt": COPY_PROMPT, "max_tokens": 3, "cache_salt": "t"}
        plain = _post(url, body)
        request = urllib.request.Request(
            url + "/v1/completions", headers={"Content-Type": "application/json"},
            data=json.dumps({**body, "cache_salt": "u", "stream": True,
                             "stream_options": {"include_usage": True}}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            lines = [raw.decode().strip() for raw in response]
        events = [json.loads(line[5:]) for line in lines
                  if line.startswith("data:") and line[5:].strip() != "[DONE]"]
        text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
        assert text == plain["choices"][0]["text"]
        assert events[-1]["usage"]["completion_tokens"] == 3
        assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines


def test_the_served_stub_never_ready_fails_health() -> None:
    with served("--never-ready") as url:
        assert _get(url, "/health")[0] == 503
