"""What an LMCache 0.5.6 server's log says about its L2 (stack/l2/log.py), read from lines
its servers wrote on this CPU host: an adapter attached or not, and where a lookup's keys
came from (unknown where it logged nothing, never 0)."""

from __future__ import annotations

import json

import pytest

from pytest_sharedkv.stack.l2 import log as l2_log
from pytest_sharedkv.stack.l2.log import KeySplit

ESC = "\x1b"
RESP = json.dumps({"type": "resp", "host": "127.0.0.1", "port": 16379})
FS = json.dumps({"type": "fs", "base_path": "/tmp/l2x/fsdir"})
ATTACHED_RESP = (f"{ESC}[32;20m[2026-12-02 09:23:55,776] LMCache INFO:{ESC}[0m Created RESP L2 "
                 f"adapter: 127.0.0.1:16379 (workers=8) {ESC}[3m(resp_l2_adapter.py:163:"
                 f"lmcache.v1.distributed.l2_adapters.resp_l2_adapter){ESC}[0m")
ATTACHED_FS = ("[2026-12-02 09:23:23,422] LMCache INFO: Initialized FSL2Adapter with "
               "base_path=/tmp/l2x/fsdir, relative_tmp_dir=None, read_ahead_size=None, "
               "use_odirect=False (fs_l2_adapter.py:304)")
REFUSED = "[LMCache Connector Worker Error] connection failed"
RUNNING = "[2026-12-02 09:23:55,827] LMCache INFO: LMCache zmq cache server is running on ..."


def _retained(rid: str, retained: int = 8, l1: int = 0, l2: int = 8) -> str:
    return (f"{ESC}[32;20m[2026-12-02 09:23:28,891] LMCache INFO:{ESC}[0m Prefetch request "
            f"completed (L1+L2): {retained}/8 retained keys ({l1} L1, {l2} L2) in 6.8 ms "
            f"(external_request_id={rid}, prefetch_request_id=1) {ESC}[3m(storage_manager.py:"
            f"651:lmcache.v1.distributed.storage_manager){ESC}[0m")


@pytest.mark.parametrize(("log", "adapters", "error"), [
    ([ATTACHED_RESP, RUNNING], (RESP,), None),
    ([ATTACHED_RESP, REFUSED, REFUSED, RUNNING], (RESP,), f"its log says {REFUSED!r}"),
    ([RUNNING], (RESP,), "its log lacks 'Created RESP L2 adapter: 127.0.0.1:16379' for "
                         f"adapter {RESP}"),
    ([ATTACHED_RESP, RUNNING], (RESP, FS), "its log lacks 'Initialized FSL2Adapter with "
                                           f"base_path=/tmp/l2x/fsdir,' for adapter {FS}"),
    ([ATTACHED_RESP, ATTACHED_FS], (RESP, FS), None),
    ([RUNNING], (json.dumps({"type": "mooncake_store"}),), None),  # no known line: unchecked
    ([ATTACHED_FS], (json.dumps({"type": "fault_inject", "inner": json.loads(FS)}),), None),
    ([RUNNING], (json.dumps({"type": "fault_inject", "inner": json.loads(FS)}),),
     "its log lacks 'Initialized FSL2Adapter with base_path=/tmp/l2x/fsdir,' for adapter "
     '{"type": "fault_inject", "inner": {"type": "fs", "base_path": "/tmp/l2x/fsdir"}}'),
])
def test_a_server_serving_without_its_l2_is_named(log: list[str], adapters: tuple[str, ...],
                                                  error: str | None) -> None:
    assert l2_log.l2_attach_error("\n".join(log), adapters) == error


def test_another_port_or_directory_is_not_the_adapter_attached() -> None:
    other = json.dumps({"type": "resp", "host": "127.0.0.1", "port": 1637})
    assert l2_log.l2_attach_error(ATTACHED_RESP, (other,)) is not None


def test_the_split_of_one_lookup_is_read_by_its_request_id() -> None:
    log = "\n".join([_retained("sharedkv-b-fetch-fs", 8, 8, 0), RUNNING,
                     _retained("sharedkv-b-fetch-resp", 8, 0, 8),
                     _retained("sharedkv-b-fetch-gap", 4, 0, 4)])
    assert l2_log.key_split(log, "sharedkv-b-fetch-resp") == KeySplit(
        "sharedkv-b-fetch-resp", 8, 8, 0, 8)
    assert l2_log.key_split(log, "sharedkv-b-fetch-fs") == KeySplit(
        "sharedkv-b-fetch-fs", 8, 8, 8, 0)
    gap = l2_log.key_split(log, "sharedkv-b-fetch-gap")
    assert gap.describe() == "4/8 retained keys (0 L1, 4 L2)"
    assert gap.as_dict() == {"request_id": "sharedkv-b-fetch-gap", "retained": 4,
                             "requested": 8, "l1": 0, "l2": 4}


def test_a_repeated_lookup_is_read_as_its_last() -> None:
    """Seen: B's lookup and retrieve repeated on the same reader is answered from its L1
    (8 L1, 0 L2); the split is that of the lookup the retrieve followed, the last one."""
    log = "\n".join([_retained("sharedkv-b-fetch-fs", 8, 0, 8),
                     _retained("sharedkv-b-fetch-fs", 8, 8, 0)])
    assert l2_log.key_split(log, "sharedkv-b-fetch-fs").describe() == (
        "8/8 retained keys (8 L1, 0 L2)")


def test_a_lookup_the_server_logged_nothing_for_is_unknown_not_zero() -> None:
    """0.5.6 logs the split only for a lookup that hit (storage_manager.py:649)."""
    split = l2_log.key_split(_retained("sharedkv-b-fetch-resp"), "sharedkv-b-fetch")
    assert not split.known and (split.l1, split.l2) == (None, None)
    assert split.describe() == ("unknown (the server logged no 'retained keys' line for "
                                "sharedkv-b-fetch)")
