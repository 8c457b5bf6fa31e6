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
