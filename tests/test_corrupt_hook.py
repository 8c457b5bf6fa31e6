"""The sensitivity gate's hook in the LMCache server: it zeroes the chunks the control file
names in retrieves only (never stores), through the raw bytes, logs each, and never raises
into LMCache (a failed retrieve takes a hybrid vLLM engine down)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.engine_hooks import corrupt_hook


class FakeObj:
    def __init__(self, size: int) -> None:
        import torch

        self.raw_data = torch.full((size + 8,), 7, dtype=torch.uint8)
        self.size = size

    def get_size(self) -> int:
        return self.size

    @property
    def tensor(self) -> Any:  # LMCache 0.5.6's view raises for hybrid object groups
        raise RuntimeError("shape '[2, 1, 16, 256]' is invalid for input of size 32768")


class Broken:
    def get_size(self) -> int:
        raise RuntimeError("no size")


def run_wrapped(tmp_path: Path, objs: list[Any], direction: str) -> list[Any]:
    seen: list[Any] = []

    def transfer(cache_context: Any, block_ids_gpu: Any, memory_objs: Any,
                 object_group_id: int, batch_size: int, skip: int, direction: Any) -> None:
        seen.append([bytes(o.raw_data[:4].tolist()) if hasattr(o, "raw_data") else None
                     for o in memory_objs])

    control = tmp_path / "control.json"
    control.write_text(json.dumps({"zero_chunks": [1, 5]}))
    wrapped = corrupt_hook.wrapper(control, str(tmp_path / "zeroed.log"))("t", transfer)
    wrapped(None, None, objs, 2, batch_size=4, skip=0, direction=f"TransferDirection.{direction}")
    return seen


def test_zeroes_named_chunks_of_a_retrieve_and_logs_them(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    objs: list[Any] = [FakeObj(16), FakeObj(16), None]
    seen = run_wrapped(tmp_path, objs, "H2D")
    assert seen == [[b"\x07" * 4, b"\x00" * 4, None]]
    assert int(objs[1].raw_data[16]) == 7  # only get_size() bytes
    assert corrupt_hook.read_log(tmp_path / "zeroed.log") == [(2, 1, 16)]


def test_leaves_stores_alone_and_never_raises(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    objs = [FakeObj(16), FakeObj(16)]
    assert run_wrapped(tmp_path, objs, "D2H") == [[b"\x07" * 4, b"\x07" * 4]]
    run_wrapped(tmp_path, [FakeObj(16), Broken()], "H2D")  # must not raise
    assert "could not zero chunk 1 of group 2: RuntimeError: no size" in capsys.readouterr().err
    assert corrupt_hook.read_log(tmp_path / "zeroed.log") == []


def test_control_file_absent_or_garbage_zeroes_nothing(tmp_path: Path) -> None:
    assert corrupt_hook.chunks_to_zero(tmp_path / "absent.json") == []
    (tmp_path / "bad.json").write_text("{not json")
    assert corrupt_hook.chunks_to_zero(tmp_path / "bad.json") == []
    (tmp_path / "odd.json").write_text(json.dumps({"zero_chunks": [3, -1, "x", 2]}))
    assert corrupt_hook.chunks_to_zero(tmp_path / "odd.json") == [3, 2]


LAYOUT_056 = {  # the function lives in object_group_transfer; the server module imports it
    "object_group_transfer.py": "def transfer_kv_per_object_group(ctx, ids, objs, group, "
                                "batch, skip, direction):\n    return 'moved'\n",
    "modules/lmcache_driven_transfer.py":
        "from lmcache.v1.multiprocess.object_group_transfer import "
        "transfer_kv_per_object_group\n"
        "def retrieve(objs):\n    return transfer_kv_per_object_group(None, None, objs, 0, 1, 0,"
        " 'TransferDirection.H2D')\n",
}
LAYOUT_053 = {  # 0.5.3: defined and called inside the server module
    "modules/lmcache_driven_transfer.py":
        "def transfer_kv_per_object_group(ctx, ids, objs, group, batch, skip, direction):\n"
        "    return 'moved'\n"
        "def retrieve(objs):\n    return transfer_kv_per_object_group(None, None, objs, 0, 1, 0,"
        " 'TransferDirection.H2D')\n",
}
RETRIEVE = """
import os, sys
from pytest_sharedkv.engine_hooks import corrupt_hook
corrupt_hook.install()
class Obj:
    zeroed = 0
    raw_data = None
    def get_size(self): return 4
    @property
    def tensor(self): return self
    def zero_(self): Obj.zeroed += 1
from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import retrieve
print(retrieve([Obj(), Obj()]), Obj.zeroed)
"""


@pytest.mark.parametrize("layout", [LAYOUT_056, LAYOUT_053], ids=["0.5.6", "0.5.3"])
def test_the_gate_zeroes_once_wherever_the_release_keeps_the_transfer(
        tmp_path: Path, layout: dict[str, str]) -> None:
    """0.5.3 keeps transfer_kv_per_object_group in modules.lmcache_driven_transfer; 0.5.6
    moved it to object_group_transfer and imports it back: both are hooked, a chunk is
    zeroed once (the wrap is marked), and a release with neither would leave the gate VOID."""
    import os
    import subprocess
    import sys

    root = tmp_path / "site" / "lmcache" / "v1" / "multiprocess"
    for rel, text in {**layout, "../../__init__.py": "", "../__init__.py": "", "__init__.py": "",
                      "modules/__init__.py": ""}.items():
        path = (root / rel).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"zero_chunks": [1]}))
    log = tmp_path / "zeroed.log"
    env = {**os.environ, corrupt_hook.CONTROL_ENV: str(control), corrupt_hook.LOG_ENV: str(log),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(Path.cwd())])}
    done = subprocess.run([sys.executable, "-c", RETRIEVE], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["moved", "1"]
    assert corrupt_hook.read_log(log) == [(0, 1, 4)]
    where = "object_group_transfer" if layout is LAYOUT_056 else "modules.lmcache_driven_transfer"
    assert corrupt_hook.read_wrapped(log) == [
        f"lmcache.v1.multiprocess.{where}:transfer_kv_per_object_group"]


def test_a_hook_that_found_no_target_says_so_and_no_list_is_unknown(tmp_path: Path) -> None:
    """0.5.3's gate was VOID with no word of why: the hook lists what it wrapped beside its
    log, created on arming, so 'wrapped none' is told apart from a hook that said nothing."""
    import os
    import subprocess
    import sys

    log = tmp_path / "zeroed.log"
    assert corrupt_hook.read_wrapped(log) is None  # the stub, or an older hook
    env = {**os.environ, corrupt_hook.CONTROL_ENV: str(tmp_path / "control.json"),
           corrupt_hook.LOG_ENV: str(log), "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run([sys.executable, "-c", "from pytest_sharedkv.engine_hooks import "
                           "corrupt_hook; corrupt_hook.install(); import json"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert corrupt_hook.read_wrapped(log) == []


@pytest.mark.parametrize("chunk", ["", "0", "x"])
def test_a_gate_that_needs_a_chunk_size_stays_unarmed_without_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        chunk: str) -> None:
    """The in-process and native gates (corrupt_hook.arm with a chunk variable): no chunk
    size, no wrapping and no start logged, so the gate reads none and says VOID."""
    from pytest_sharedkv.engine_hooks import inprocess_gate_hook as hook

    log = tmp_path / "gate.log"
    monkeypatch.setenv(hook.CONTROL_ENV, str(tmp_path / "control.json"))
    monkeypatch.setenv(hook.LOG_ENV, str(log))
    monkeypatch.setenv(hook.CHUNK_ENV, chunk)
    assert hook.install() is None
    assert not corrupt_hook.armed_path(log).exists()
    assert not corrupt_hook.wrapped_path(log).exists()
    assert f"{hook.CHUNK_ENV} is not a chunk size; the gate is not armed" in \
        capsys.readouterr().err


def test_a_gate_armed_with_a_chunk_size_logs_its_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    import sys

    from pytest_sharedkv.engine_hooks import inprocess_gate_hook as hook

    log = tmp_path / "gate.log"
    monkeypatch.setenv(hook.CONTROL_ENV, str(tmp_path / "control.json"))
    monkeypatch.setenv(hook.LOG_ENV, str(log))
    monkeypatch.setenv(hook.CHUNK_ENV, "32")
    for name in [m for m in sys.modules if m == "lmcache" or m.startswith("lmcache.")]:
        monkeypatch.delitem(sys.modules, name)  # as in a replica before LMCache's import
    finder = hook.install()
    try:
        assert finder is not None
        assert corrupt_hook.armed_path(log).exists()
        assert corrupt_hook.wrapped_path(log).read_text() == ""
        assert "sensitivity gate armed in this replica" in capsys.readouterr().err
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
