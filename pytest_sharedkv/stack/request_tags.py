"""Request tags: the X-Request-Id every request the suite sends carries, which vLLM names its
engine request after, so the in-engine KV audit's digests name the case, step and replica."""

from __future__ import annotations

REQUEST_TAG = "sharedkv"  # X-Request-Id: sharedkv.<case>.<step>.<replica>


def request_tag(case_id: str, step: str, replica: str) -> str:
    """The X-Request-Id the runner sends: vLLM names its engine request after it
    (cmpl-<tag>-<n>-<suffix>), so the in-engine KV audit can name the request."""
    return f"{REQUEST_TAG}.{case_id}.{step}.{replica}"


def parse_request_tag(engine_request_id: str) -> tuple[str, str, str] | None:
    """(case, step, replica) from an engine request id, or None for untagged requests."""
    at = engine_request_id.find(REQUEST_TAG + ".")
    if at < 0:
        return None
    parts = engine_request_id[at:].split(".")
    if len(parts) < 4:
        return None
    return parts[1], parts[2], parts[3].split("-")[0]
