"""The corruption matrix is computed once per model and inputs where a run names a cache
(the self-tests do), and again for any other model, input or dtype."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sharedkv.models import copy_matrix
from pytest_sharedkv.models.copy_matrix import CACHE_ENV, MatrixRow, run_matrix


def fake_model(path: Path, weights: bytes) -> Path:
    path.mkdir()
    for name, data in (("config.json", b"{}"), ("model.safetensors", weights),
                       ("sharedkv-tokenizer.json", b"{}")):
        (path / name).write_bytes(data)
    return path


def test_a_matrix_is_computed_once_per_model_and_inputs(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Path, str]] = []

    def compute(model_dir: Path, requests: object, chunk: int, corruptions: object,
                steps: int, dtype: str, progress: object) -> list[MatrixRow]:
        calls.append((model_dir, dtype))
        return [MatrixRow("clean", "3k-00", (1, 2), (1, 2), 60.5)]

    monkeypatch.setattr(copy_matrix, "_run_matrix", compute)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    model = fake_model(tmp_path / "m", b"weights")
    requests = [("3k-00", [0, 5, 6], 1, 2)]
    first = run_matrix(model, requests, chunk=32)
    assert run_matrix(model, requests, chunk=32) == first  # from the cache
    assert len(calls) == 1
    run_matrix(model, requests, chunk=32, dtype="float32")  # another input: computed
    run_matrix(fake_model(tmp_path / "other", b"other weights"), requests, chunk=32)
    assert len(calls) == 3
    monkeypatch.delenv(CACHE_ENV)
    run_matrix(model, requests, chunk=32)  # no cache named: always computed
    assert len(calls) == 4
