"""One streamed completion, timed from the client: what a user waits for.

TTFT runs from just before the request is sent to the first event that carries a token (a
choice: vLLM streams one per engine step, with empty text for a token that renders as
nothing, as a random-weight model's ids past its tokenizer do); decode rate is
``(N_out - 1) / (t_last - t_first)`` between the first and the last token event; e2e runs
to the end of the stream. N_out comes from the streamed usage
(``stream_options.include_usage``), else from the token events counted. Each event is
stamped as its line arrives, so an engine that batches tokens into one event shows as
such and is not smoothed over.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from pytest_sharedkv.perf.observations import Observation
from pytest_sharedkv.stack.completions import read_usage
from pytest_sharedkv.stack.pair import Replica, ReplicaError


@dataclass(frozen=True)
class Timing:
    replica: str
    ttft_s: float
    t_first_s: float
    t_last_s: float
    e2e_s: float
    output_tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None

    @property
    def decode_tok_s(self) -> float | None:
        span = self.t_last_s - self.t_first_s
        if self.output_tokens < 2 or span <= 0:
            return None
        return (self.output_tokens - 1) / span


def _failure(replica: Replica, why: str) -> ReplicaError:
    where = f"replica {replica.name} ({replica.base_url})"
    if replica.process is None:
        return ReplicaError(f"{where}: {why}")
    return ReplicaError(f"{where}: {why}\n--- last lines of {replica.process.log_path} ---\n"
                        f"{replica.process.tail()}")


def stream_timing(replica: Replica, body: dict[str, Any], timeout: float = 600.0,
                  request_id: str | None = None) -> Timing:
    """POST BODY to REPLICA's /v1/completions as a stream and time it; REQUEST_ID goes as
    X-Request-Id (vLLM names its engine request after it, so a server's log can be read
    for this request)."""
    payload = {"model": replica.served_model(), **body, "stream": True,
               "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json",
               **({"X-Request-Id": request_id} if request_id else {})}
    request = urllib.request.Request(replica.base_url + "/v1/completions",
                                     data=json.dumps(payload).encode(), headers=headers)
    first = last = None
    chunks = 0
    usage: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                now = time.perf_counter()
                line = raw.decode().strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                usage = event.get("usage") or usage
                if event.get("choices"):
                    chunks += 1
                    first = now if first is None else first
                    last = now
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise _failure(replica, f"HTTP {exc.code} for a streamed completion: {detail}"
                       ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _failure(replica, f"streamed completion failed: {exc}") from None
    ended = time.perf_counter()
    if first is None or last is None:
        raise _failure(replica, "the stream carried no token")
    counts = read_usage({"usage": usage})
    return Timing(replica.name, first - started, first - started, last - started,
                  ended - started, counts.completion_tokens or chunks, counts.prompt_tokens,
                  counts.cached_tokens)


def observation(timing: Timing, *, arm: str, block: int, pair: int, size: str, step: str,
                request: str, payload_sha256: str, prompt_tokens: int | None = None,
                warmup: bool = False) -> Observation:
    """TIMING as the data model's record; PROMPT_TOKENS stands in where usage had none."""
    tokens = timing.prompt_tokens if timing.prompt_tokens is not None else prompt_tokens
    return Observation(arm=arm, block=block, pair=pair, size=size, step=step,
                       request=request, payload_sha256=payload_sha256,
                       replica=timing.replica, prompt_tokens=tokens or 0,
                       output_tokens=timing.output_tokens, ttft_s=timing.ttft_s,
                       decode_tok_s=timing.decode_tok_s, e2e_s=timing.e2e_s, warmup=warmup,
                       cached_tokens=timing.cached_tokens)


def measure(replica: Replica, body: dict[str, Any], *, arm: str, block: int, pair: int,
            size: str, step: str, request: str, payload_sha256: str,
            warmup: bool = False, timeout: float = 600.0) -> Observation:
    """One streamed request on REPLICA, as an Observation."""
    return observation(stream_timing(replica, body, timeout), arm=arm, block=block,
                       pair=pair, size=size, step=step, request=request,
                       payload_sha256=payload_sha256, warmup=warmup)
