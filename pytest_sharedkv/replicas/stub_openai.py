"""A stub OpenAI-compatible completion server: a TEST DOUBLE for the suite's own logic.

It is not an inference engine. It answers ``/health``, ``/v1/models``, ``/metrics`` and
``/v1/completions`` (streamed or not, with usage, ``cached_tokens``, logprobs, stop
strings and vLLM's ``return_token_ids``) and counts prompt-prefix hits per ``cache_salt``
the way a prefix cache would, in whole blocks. ``--pool DIR`` makes two stubs share a
directory the way two engines share an LMCache pool (blocks found there count as external
hits); without it a stub keeps only its own cache (the perf tier's OFF arm).
``--prefill-us U`` waits U microseconds per prompt token that no cache held before it
answers (before the first streamed token), so hits are faster than cold prefill, as in an
engine.

Prompts in the copy model's words (``w00 w01 ...``) are answered with the copy rule the
copy model implements in its weights (``service.copy_rule``); a prompt counts ``<s>`` as
its first token, and hits stop one token short of the prompt, as vLLM's do. Other prompts
get a deterministic hash continuation.

It can misbehave on purpose: ``--crash-after N`` exits after N completions,
``--never-ready`` keeps /health failing, ``--corrupt-external`` changes the answer whenever
a request hit the pool, ``--ignore-salt`` makes every namespace share blocks (a leak),
``--diverge`` answers copy prompts one word off even cold (a model fault, not a cache
fault), and ``--corrupt-control FILE`` zeroes the chunks the file names in every pool hit
(the service tier's sensitivity gate, as the launched server's hook does; ``--corrupt-log``
gets a line per zeroed chunk). Every response
carries ``X-Sharedkv-Test-Double: 1``.

    python -m pytest_sharedkv.replicas.stub_openai --port P [--pool DIR] [--block N] ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BLOCK = 16
COPY_WORD = re.compile(r"^(w\d\d|<miss>)$")


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str = args.name
        self.pool: Path | None = args.pool
        self.completions = 0
        self.hits = 0
        self.external_hits = 0
        self.queries = 0
        self.blocks: set[str] = set()
        self.lock = threading.Lock()

    def lookup(self, salt: str, tokens: list[str], block: int, limit: int
               ) -> tuple[int, int]:
        """(local, external) hit tokens: whole blocks of the first LIMIT tokens, in order."""
        if self.args.ignore_salt:
            salt = ""
        keys, chain = [], hashlib.sha256(salt.encode()).hexdigest()
        for end in range(block, limit + 1, block):  # a prefix hash chain, block by block
            chain = hashlib.sha256(f"{chain}|{' '.join(tokens[end - block:end])}".encode()
                                   ).hexdigest()
            keys.append((end, chain))
        local = external = 0
        pooled = set()
        for end, key in keys:
            if key in self.blocks and external == 0:
                local = end
            elif self.pool is not None and (self.pool / key).exists():
                external = end - local
                pooled.add(key)
            else:
                break
        for _, key in keys:
            if key not in self.blocks:  # stored once (creating files is slow on some disks)
                self.blocks.add(key)
                if self.pool is not None and key not in pooled:
                    (self.pool / key).touch()
        return local, external


def _continuation(prompt: str, max_tokens: int) -> list[str]:
    digest = hashlib.sha256(prompt.encode()).hexdigest() * (1 + max_tokens // 16)
    return [f"tok{digest[i:i + 4]}" for i in range(0, 4 * max_tokens, 4)]


def _zeroed(control: Path | None) -> list[int]:
    if control is None:
        return []
    from pytest_sharedkv.replicas.corrupt_hook import chunks_to_zero

    return chunks_to_zero(control)


def _copy_answer(state: _State, words: list[str], max_tokens: int, external: int,
                 local: int) -> list[str]:
    from pytest_sharedkv.replicas.copy_model import CopyModelRecipe, ids_of, vocabulary
    from pytest_sharedkv.service.copy_rule import continue_ids

    recipe = CopyModelRecipe()
    vocab = vocabulary(recipe)
    miss = vocab.index("\u2581<miss>")
    ids = [0, *(i if i >= 0 else miss for i in ids_of(" ".join(words), recipe))]
    hidden: set[int] = set()
    if external:
        from pytest_sharedkv.replicas.corrupt_hook import log_zeroed

        block = state.args.block
        for chunk in _zeroed(state.args.corrupt_control):
            start = chunk * block
            if local <= start < local + external:
                hidden.update(range(start, start + block))
                log_zeroed(state.args.corrupt_log, 0, chunk, 0)
    answer = continue_ids(ids, max_tokens, miss, hidden)
    if state.args.diverge:
        answer = [answer[-1], *answer[:-1]]
    return [vocab[i].removeprefix("\u2581") for i in answer]


def make_handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            print(f"[{state.name}] {self.command} {self.path}", flush=True)

        def _headers(self, code: int, content_type: str, length: int | None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            if length is not None:
                self.send_header("Content-Length", str(length))
            else:
                self.send_header("Connection", "close")
            self.send_header("X-Sharedkv-Test-Double", "1")
            self.end_headers()

        def _send(self, code: int, body: object, content_type: str = "application/json"
                  ) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self._headers(code, content_type, len(data))
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                never = state.args.never_ready
                self._send(503 if never else 200, {"ok": not never})
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
            request: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
            prompt = str(request.get("prompt", ""))
            salt = str(request.get("cache_salt", ""))
            max_tokens = int(request.get("max_tokens", 16))
            words = prompt.split()
            copy = len(words) > 5 and all(COPY_WORD.match(w) for w in words)
            tokens = ["<s>", *words] if copy else words
            with state.lock:
                limit = len(tokens) - 1 if copy else len(tokens)
                block = state.args.block if copy else BLOCK
                local, external = state.lookup(salt, tokens, block, limit)
                cached = local + external
                state.queries += len(tokens)
                state.hits += local
                state.external_hits += external
                state.completions += 1
                done = state.completions
            if state.args.prefill_us:
                time.sleep(state.args.prefill_us * 1e-6 * (len(tokens) - cached))
            if copy:
                out = _copy_answer(state, words, max_tokens, external, local)
            else:
                out = _continuation(prompt, max_tokens)
            if external and state.args.corrupt_external:
                out = _continuation(prompt + " stale", max_tokens)
            finish = "length"
            for stop in request.get("stop") or []:
                text_so_far = ""
                for i, word in enumerate(out):
                    text_so_far += " " + word
                    if stop in text_so_far:
                        out, finish = out[:i], "stop"
                        break
                if finish == "stop":
                    break
            usage = {"prompt_tokens": len(tokens), "completion_tokens": len(out),
                     "total_tokens": len(tokens) + len(out),
                     "prompt_tokens_details": {"cached_tokens": cached}}
            choice: dict[str, Any] = {"index": 0, "text": "".join(" " + w for w in out),
                                      "finish_reason": finish}
            if request.get("logprobs") is not None:
                choice["logprobs"] = {
                    "tokens": [" " + w for w in out], "token_logprobs": [0.0] * len(out),
                    "top_logprobs": [{" " + w: 0.0} for w in out],
                    "text_offset": [4 * i for i in range(len(out))]}
            if request.get("return_token_ids") and copy:
                from pytest_sharedkv.replicas.copy_model import CopyModelRecipe, ids_of

                choice["token_ids"] = ids_of(" ".join(out), CopyModelRecipe())
            if request.get("stream"):
                self._stream(done, out, choice, usage, request)
            else:
                self._send(200, {"id": f"cmpl-{done}", "object": "text_completion",
                                 "model": "stub", "choices": [choice], "usage": usage})
            if state.args.crash_after is not None and done >= state.args.crash_after:
                print(f"[{state.name}] crashing on purpose after {done} completions",
                      flush=True)
                os._exit(3)

        def _stream(self, done: int, out: list[str], choice: dict[str, Any],
                    usage: dict[str, Any], request: dict[str, Any]) -> None:
            self._headers(200, "text/event-stream", None)
            base = {"id": f"cmpl-{done}", "object": "text_completion", "model": "stub"}
            for i, word in enumerate(out):
                last = i == len(out) - 1
                part = {**base, "choices": [{"index": 0, "text": " " + word,
                                             "finish_reason": choice["finish_reason"]
                                             if last else None}]}
                self.wfile.write(f"data: {json.dumps(part)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.001)
            if (request.get("stream_options") or {}).get("include_usage"):
                tail = {**base, "choices": [], "usage": usage}
                self.wfile.write(f"data: {json.dumps(tail)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


class _Server(ThreadingHTTPServer):
    # the default backlog of 5 drops a burst of connections (a client's SYN is then
    # retried a second later): the perf tier opens 8 sessions at once
    request_queue_size = 128


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="stub")
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--pool", type=Path, default=None)
    parser.add_argument("--block", type=int, default=32,
                        help="hit granularity of copy-model prompts (tokens)")
    parser.add_argument("--prefill-us", type=float, default=0.0,
                        help="simulated prefill: microseconds per uncached prompt token")
    parser.add_argument("--corrupt-external", action="store_true")
    parser.add_argument("--ignore-salt", action="store_true")
    parser.add_argument("--diverge", action="store_true")
    parser.add_argument("--corrupt-control", type=Path, default=None)
    parser.add_argument("--corrupt-log", default=None)
    args = parser.parse_args(argv)
    if args.pool is not None:
        args.pool.mkdir(parents=True, exist_ok=True)
    server = _Server(("127.0.0.1", args.port), make_handler(_State(args)))
    print(f"[{args.name}] TEST DOUBLE serving on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
