"""An LMCache server given L2 adapters (stack/lmcache_server.py): each reaches its command
line as one --l2-adapter, its log keeps the INFO lines the L2 checks read, and an adapter
that is not a JSON object with a type is refused before anything starts. (That a server
answering ok without its Redis fails its start is test_l2_transfer's, on a real server.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

RESP = json.dumps({"type": "resp", "host": "127.0.0.1", "port": 6379})
FS = json.dumps({"type": "fs", "base_path": "/kv"})


def test_each_adapter_is_one_flag_and_the_log_keeps_info(tmp_path: Path) -> None:
    server = LMCacheServer(ServerConfig(l1_size_gb=0.25, l2_adapters=(RESP, FS)), tmp_path,
                           env={"LMCACHE_LOG_LEVEL": "WARNING"})
    argv = server.process.argv
    flags = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--l2-adapter"]
    assert flags == [RESP, FS]
    assert argv[argv.index("--l1-size-gb") + 1] == "0.25"
    assert server.process.env["LMCACHE_LOG_LEVEL"] == "INFO"


def test_a_server_without_l2_is_launched_as_before(tmp_path: Path) -> None:
    server = LMCacheServer(ServerConfig(), tmp_path, env={"LMCACHE_LOG_LEVEL": "WARNING"})
    assert "--l2-adapter" not in server.process.argv
    assert server.process.env["LMCACHE_LOG_LEVEL"] == "WARNING"
    assert server.l2_error() is None


@pytest.mark.parametrize(("adapter", "message"), [
    ("{type: fs}", "L2 adapter '{type: fs}' is not JSON: "),
    ('["fs"]', "L2 adapter '[\"fs\"]' is not a JSON object with a \"type\""),
    ('{"base_path": "/kv"}', "L2 adapter '{\"base_path\": \"/kv\"}' is not a JSON object "
                             "with a \"type\""),
])
def test_an_adapter_that_is_not_an_object_with_a_type_is_refused(adapter: str,
                                                                 message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ServerConfig(l2_adapters=(adapter,))
