"""A stub OpenAI-compatible completion server: a TEST DOUBLE for the launcher's own logic.

It is not an inference engine. It answers ``/health``, ``/v1/models``, ``/metrics`` and
``/v1/completions`` with a deterministic continuation of the prompt, counts prompt-prefix
hits per ``cache_salt`` the way a prefix cache would (in whole 16-token blocks), and can
misbehave on purpose (``--crash-after N`` exits after N completions, ``--never-ready``
keeps /health failing) so the launcher's readiness, crash and teardown paths can be
tested on CPU. ``--pool DIR`` makes two stubs share a directory the way two engines share
an LMCache pool (blocks found there count as external hits); ``--corrupt-external``
changes the answer whenever a request hit the pool (a fault the suite must catch). Every
response carries ``X-Sharedkv-Test-Double: 1``.

    python -m pytest_sharedkv.replicas.stub_openai --port P [--pool DIR] [--crash-after N]
        [--never-ready] [--corrupt-external]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BLOCK = 16


class _State:
    def __init__(self, crash_after: int | None, never_ready: bool, name: str,
                 pool: Path | None, corrupt_external: bool) -> None:
        self.crash_after = crash_after
        self.never_ready = never_ready
        self.name = name
        self.pool = pool
        self.corrupt_external = corrupt_external
        self.completions = 0
        self.hits = 0
        self.external_hits = 0
        self.queries = 0
        self.blocks: set[str] = set()
        self.lock = threading.Lock()

    def lookup(self, salt: str, tokens: list[str]) -> tuple[int, int]:
        """(local, external) hit tokens: whole blocks of the prompt prefix, in order."""
        keys = [(end, hashlib.sha256(f"{salt}|{' '.join(tokens[:end])}".encode()).hexdigest())
                for end in range(BLOCK, len(tokens) + 1, BLOCK)]
        local = external = 0
        for end, key in keys:
            if key in self.blocks and external == 0:
                local = end
            elif self.pool is not None and (self.pool / key).exists():
                external = end - local
            else:
                break
        for _, key in keys:
            self.blocks.add(key)
            if self.pool is not None:
                (self.pool / key).touch()
        return local, external


def _tokens(prompt: str) -> list[str]:
    return prompt.split()


def _continuation(prompt: str, max_tokens: int) -> str:
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    return " ".join(f"tok{digest[i:i + 4]}" for i in range(0, 4 * max_tokens, 4))


def make_handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            print(f"[{state.name}] {self.command} {self.path}", flush=True)

        def _send(self, code: int, body: object, content_type: str = "application/json"
                  ) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Sharedkv-Test-Double", "1")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(503 if state.never_ready else 200, {"ok": not state.never_ready})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            elif self.path == "/metrics":
                text = (f"vllm:prefix_cache_queries_total {state.queries}\n"
                        f"vllm:prefix_cache_hits_total {state.hits}\n"
                        f"vllm:external_prefix_cache_hits_total {state.external_hits}\n")
                self._send(200, text, "text/plain")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self._send(404, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            prompt = str(request.get("prompt", ""))
            salt = str(request.get("cache_salt", ""))
            tokens = _tokens(prompt)
            with state.lock:
                local, external = state.lookup(salt, tokens)
                cached = local + external
                state.queries += len(tokens)
                state.hits += local
                state.external_hits += external
                state.completions += 1
                done = state.completions
            text = _continuation(prompt, int(request.get("max_tokens", 16)))
            if external and state.corrupt_external:
                text = _continuation(prompt + " stale", int(request.get("max_tokens", 16)))
            self._send(200, {
                "id": f"cmpl-{done}", "object": "text_completion", "model": "stub",
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(tokens), "completion_tokens":
                          int(request.get("max_tokens", 16)),
                          "prompt_tokens_details": {"cached_tokens": cached}},
            })
            if state.crash_after is not None and done >= state.crash_after:
                print(f"[{state.name}] crashing on purpose after {done} completions", flush=True)
                os._exit(3)

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="stub")
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--pool", type=Path, default=None)
    parser.add_argument("--corrupt-external", action="store_true")
    args = parser.parse_args(argv)
    if args.pool is not None:
        args.pool.mkdir(parents=True, exist_ok=True)
    state = _State(args.crash_after, args.never_ready, args.name, args.pool,
                   args.corrupt_external)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    print(f"[{args.name}] TEST DOUBLE serving on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
