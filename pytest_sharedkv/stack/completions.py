"""The ``/v1/completions`` request the suite sends and the usage it reads back.

One definition for the service, replica_pair and perf tiers: every check compares answers
token for token, so every request is greedy (temperature 0), and every hit count comes from
the same field (``usage.prompt_tokens_details.cached_tokens``), read the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def request_body(prompt: str, max_tokens: int, cache_salt: str | None = None, *,
                 logprobs: bool = False, extra: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """A greedy completion of PROMPT; CACHE_SALT puts it in its own cache namespace (None:
    the engine's shared one); EXTRA (the user's engine fields) goes last and may override."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    if logprobs:
        body["logprobs"] = 1
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if extra:
        body.update(extra)
    return body


@dataclass(frozen=True)
class Usage:
    """A response's token counts; None where the engine gave none (unknown, not zero)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, int) else None


def read_usage(data: Mapping[str, Any]) -> Usage:
    """The usage of a completion response (or of a stream's usage event): a missing or
    malformed field reads as None, never as a guessed 0."""
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Usage(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
                 _count(details.get("cached_tokens")))
