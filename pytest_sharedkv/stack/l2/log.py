"""What an LMCache 0.5.6 server's log says about its L2: whether each adapter attached, the
connection errors of its native connectors, and where a lookup's keys came from.

A server whose Redis is down starts, answers its HTTP ``/`` with ``{"status":"ok"}`` and
serves from L1 alone; the only trace is the native connector's
``[LMCache Connector Worker Error] connection failed`` lines (``lmcache_redis``'s, on
stderr, before the server reports running). The split of a lookup is the storage manager's
INFO line ``Prefetch request completed (L1+L2): 8/8 retained keys (0 L1, 8 L2) ...
(external_request_id=<request id>, ...)`` (``storage_manager.py:651``), logged only for a
lookup that hit: a lookup without one is unknown, never "0 from L2".

The id it logs is the one vLLM's request carries (LMCache's own ``lmcache_mp_connector``
submits its lookup under ``request.request_id``, lmcache_mp_connector.py:1296): vLLM's
engine id, ``cmpl-<X-Request-Id>-<n>-<suffix>``, so a lookup of the suite's requests is
found by the X-Request-Id the runner sent (``request_tags``), as the KV audit finds them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

CONNECTOR_ERROR = "[LMCache Connector Worker Error]"  # lmcache_redis / lmcache_fs (C++)
# The line each adapter type logs once it is created, by its config (file:line in 0.5.6).
ATTACHED: dict[str, str] = {
    "resp": "Created RESP L2 adapter: {host}:{port} ",  # resp_l2_adapter.py:163
    "fs": "Initialized FSL2Adapter with base_path={base_path},",  # fs_l2_adapter.py:304
    "fs_native": "Created FS native L2 adapter: {base_path} ",  # fs_native_l2_adapter.py:171
    "valkey": "ValkeyL2Adapter ready: ",  # valkey_l2_adapter.py:494
}
RETAINED = re.compile(
    r"Prefetch request completed \(L1\+L2\): (?P<retained>\d+)/(?P<requested>\d+) retained "
    r"keys \((?P<l1>\d+) L1, (?P<l2>\d+) L2\).*?\(external_request_id=(?P<rid>[^,)]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def attach_lines(spec: dict[str, Any]) -> list[str]:
    """The lines a server given adapter SPEC logs when it attached (a fault_inject wrapper:
    its inner adapter's); none known for another type."""
    if spec.get("type") == "fault_inject" and isinstance(spec.get("inner"), dict):
        return attach_lines(spec["inner"])
    template = ATTACHED.get(str(spec.get("type")))
    if template is None:
        return []
    try:
        return [template.format(**spec)]
    except (KeyError, IndexError):
        return []


def l2_attach_error(log: str, adapters: tuple[str, ...]) -> str | None:
    """Why a server that started with ADAPTERS (JSON) serves without one of them, or None:
    a native connector's error line, or an adapter's attach line missing."""
    text = ANSI.sub("", log)
    for line in text.splitlines():
        if line.startswith(CONNECTOR_ERROR):
            return f"its log says {line.strip()!r}"
    for adapter in adapters:
        for expected in attach_lines(json.loads(adapter)):
            if expected not in text:
                return f"its log lacks {expected.strip()!r} for adapter {adapter}"
    return None


@dataclass(frozen=True)
class KeySplit:
    """Where one lookup's keys came from, in the server's own account; None: not logged."""

    request_id: str
    retained: int | None = None
    requested: int | None = None
    l1: int | None = None
    l2: int | None = None

    @property
    def known(self) -> bool:
        return self.retained is not None

    def describe(self) -> str:
        if not self.known:
            return (f"unknown (the server logged no 'retained keys' line for "
                    f"{self.request_id})")
        return f"{self.retained}/{self.requested} retained keys ({self.l1} L1, {self.l2} L2)"

    def as_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "retained": self.retained,
                "requested": self.requested, "l1": self.l1, "l2": self.l2}


def split_for_tag(log: str, tag: str) -> KeySplit:
    """The split of the lookup of the request the suite sent with X-Request-Id TAG: the
    last one logged under an engine id that names it (``cmpl-<TAG>-<n>-<suffix>``, or TAG
    itself)."""
    from pytest_sharedkv.stack.request_tags import parse_request_tag

    wanted = parse_request_tag(tag)
    found = [m for m in RETAINED.finditer(ANSI.sub("", log))
             if m["rid"] == tag or (wanted is not None and parse_request_tag(m["rid"]) == wanted)]
    if not found:
        return KeySplit(tag)
    last = found[-1]
    return KeySplit(tag, int(last["retained"]), int(last["requested"]), int(last["l1"]),
                    int(last["l2"]))


def splits_by_tag(log: str) -> dict[tuple[str, str, str], KeySplit]:
    """Every lookup the log holds of a request the suite sent, by its tag (case, step,
    replica): the last one logged for each. Read once for a whole step: a server's log
    grows to tens of MB."""
    from pytest_sharedkv.stack.request_tags import parse_request_tag, request_tag

    found: dict[tuple[str, str, str], KeySplit] = {}
    for m in RETAINED.finditer(ANSI.sub("", log)):
        tag = parse_request_tag(m["rid"])
        if tag is not None:
            found[tag] = KeySplit(request_tag(*tag), int(m["retained"]), int(m["requested"]),
                                  int(m["l1"]), int(m["l2"]))
    return found


def retained_line(retained: int, requested: int, l1: int, l2: int, request_id: str,
                  prefetch_id: int) -> str:
    """The storage manager's line for a lookup that hit, as LMCache 0.5.6 logs it (the
    stub double logs its own lookups so)."""
    return (f"LMCache INFO: Prefetch request completed (L1+L2): {retained}/{requested} "
            f"retained keys ({l1} L1, {l2} L2) in 0.1 ms (external_request_id={request_id}, "
            f"prefetch_request_id={prefetch_id}) (storage_manager.py:651)")


def key_split(log: str, request_id: str) -> KeySplit:
    """The split of REQUEST_ID's lookup (the last one logged for it)."""
    found = [m for m in RETAINED.finditer(ANSI.sub("", log)) if m["rid"] == request_id]
    if not found:
        return KeySplit(request_id)
    last = found[-1]
    return KeySplit(request_id, int(last["retained"]), int(last["requested"]),
                    int(last["l1"]), int(last["l2"]))


STORE_FAILED = re.compile(r"Store task \d+ to adapter \d+ failed for keys: (?P<keys>.*)")


def store_failures(log: str, salt: str) -> int:
    """How many keys of cache salt SALT a server's store controller logged it could not
    write to an L2 (LMCache 0.5.6's ``Store task N to adapter M failed for keys: [...]``,
    store_controller.py:791; one ObjectKey per key)."""
    needle = f"cache_salt='{salt}')"
    return sum(m["keys"].count(needle) for m in STORE_FAILED.finditer(ANSI.sub("", log)))
