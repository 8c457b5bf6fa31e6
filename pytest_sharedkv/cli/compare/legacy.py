"""Reports written before records carried a kind and a status, or before tests recorded
their parameters: their records are read by the text rule the compare used then, and their
per-allocator tests are matched across an allocator switch by their node ids. Only such
reports come here; a current report's verdict never depends on a message or an id's text."""

from __future__ import annotations

import re
from typing import Any

from pytest_sharedkv.cli.compare.finding import Found

SERVICE = "service_regression"
NOT_STEP_TOTALS = ("gate", "session", "protocol", "model", "warm-up")


def legacy_check_kind(check: dict[str, Any]) -> Found | None:
    """A check record without a kind (an older report), read by the text rule the compare
    used before records had one. Only for such records; never for a current report."""
    key = check.get("key") or {}
    message = str(check.get("message") or "")
    detail = check.get("detail") or {}
    status = detail.get("status") if isinstance(detail, dict) else None
    if not isinstance(key, dict) or key.get("size") == "warm-up":
        return None
    lower = message.lower()
    if status == "VOID" or message.startswith("VOID") or "VOID:" in message:
        return Found.VOID
    if "leak" in lower:
        return Found.LEAK
    if "divergen" in lower or (key.get("step") == "chain" and
                               check.get("passed") != check.get("trials")):
        return Found.DIVERGENCE
    if (check.get("tier") == SERVICE and message and key.get("size") not in NOT_STEP_TOTALS
            and key.get("step") != "chain"):
        return Found.HITS
    return None


def legacy_note_kind(note: dict[str, Any]) -> Found | None:
    """A note without a status (an older report): VOID when its text says so."""
    return Found.VOID if "VOID" in str(note.get("text", "")) else None


_PARAMS = re.compile(r"\[(?P<params>[^\]]*)\]$")


def legacy_renamed_id(nodeid: str, old: str, new: str) -> str:
    """NODEID with each whole "-"-separated token OLD of its parameters' id read as NEW:
    the twin of a test of a report that did not record its parameters (``tests[].params``,
    written since), across an allocator switch."""
    match = _PARAMS.search(nodeid)
    if match is None:
        return nodeid
    tokens = [new if t == old else t for t in match["params"].split("-")]
    return nodeid[:match.start()] + "[" + "-".join(tokens) + "]"
