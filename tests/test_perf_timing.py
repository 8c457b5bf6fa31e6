"""The client-side clock of one streamed completion: every event that carries a choice is a
token, even with empty text. On the H200 the geometry model (random weights) streamed only
ids past its tokenizer, each as an event with text "", and a clock that waited for text
refused the whole screening ("the stream carried no content token")."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pytest_sharedkv.perf.timing import stream_timing
from pytest_sharedkv.stack.pair import Replica, ReplicaError


def _event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
    data: dict[str, Any] = {"object": "text_completion", "choices": choices}
    if usage is not None:
        data["usage"] = usage
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _server(events: list[bytes]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in [*events, b"data: [DONE]\n\n"]:
                self.wfile.write(event)
                self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(events: list[bytes]) -> Replica:
        server = _server(events)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return Replica("A", f"http://127.0.0.1:{server.server_address[1]}", model="m")

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


USAGE = {"prompt_tokens": 7, "completion_tokens": 4,
         "prompt_tokens_details": {"cached_tokens": 0}}


def test_events_with_empty_text_are_tokens(serve: Any) -> None:
    """As vLLM 0.26 streamed the geometry model on the H200: four choices with text ""."""
    replica = serve([*[_event([{"index": 0, "text": ""}])] * 4, _event([], USAGE)])
    timing = stream_timing(replica, {"prompt": "w01", "max_tokens": 4}, timeout=10)
    assert timing.output_tokens == 4
    assert timing.prompt_tokens == 7 and timing.cached_tokens == 0
    assert 0 < timing.ttft_s <= timing.e2e_s


def test_a_stream_with_no_choice_at_all_is_refused(serve: Any) -> None:
    replica = serve([_event([], USAGE)])
    with pytest.raises(ReplicaError, match="the stream carried no token"):
        stream_timing(replica, {"prompt": "w01", "max_tokens": 4}, timeout=10)
