"""The triage's two code remedies for LMCache's torch-fallback copy: on the current stream
(split at pin-chunk boundaries) or after the producing stream. There is no stream on CPU:
a fake CUDA records what the remedy asks of it; LMCache's own fallback is wrapped and
called where the test can (its CPU copy), and a run that never applied a remedy is VOID
naming why."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.engine_hooks import stream_remedy_hook as remedy
from pytest_sharedkv.engine_hooks.post_import import MARK

PIN = 1024


class FakeCuda:
    def __init__(self, usable: bool = True) -> None:
        self.is_usable = usable
        self.calls: list[tuple[Any, ...]] = []

    def usable(self) -> bool:
        return self.is_usable

    def current_stream(self) -> int:
        return 77

    def memcpy_async(self, dest: int, src: int, nbytes: int, stream: int) -> None:
        self.calls.append(("memcpy_async", dest, src, nbytes, stream))

    def wait_producer(self) -> None:
        self.calls.append(("wait_producer",))


def fallback(calls: list[tuple[Any, ...]]) -> Any:
    def lmcache_memcpy_async(dest: Any, src: Any, nbytes: int, direction: Any,
                             host_buffer_offset: int, host_buffer_alignments: int) -> None:
        calls.append(("cudaMemcpy", dest, src, nbytes))

    return lmcache_memcpy_async


def test_the_current_stream_remedy_splits_at_pin_chunk_boundaries(tmp_path: Path) -> None:
    cuda, log = FakeCuda(), remedy.RemedyLog(str(tmp_path / "remedy.jsonl"))
    wrapped = remedy.wrap("m:lmcache_memcpy_async", fallback(cuda.calls),
                          remedy.CURRENT_STREAM, cuda, log)
    # a 2,500-byte object 100 bytes before the end of its pin chunk: H2D, host is the source
    wrapped(10_000, 50_000, 2_500, "TransferDirection.H2D", 3 * PIN - 100, PIN)
    assert cuda.calls == [("memcpy_async", 10_000, 50_000, 100, 77),
                          ("memcpy_async", 10_100, 50_100, 1024, 77),
                          ("memcpy_async", 11_124, 51_124, 1024, 77),
                          ("memcpy_async", 12_148, 52_148, 352, 77)]
    (record,) = [r for r in remedy.read_log(tmp_path / "remedy.jsonl")
                 if r["kind"] == "applied"]
    assert (record["remedy"], record["direction"], record["bytes"], record["pieces"]) == (
        remedy.CURRENT_STREAM, "H2D", 2_500, 4)
    assert remedy.void_problem([{"kind": "armed"}, record], remedy.CURRENT_STREAM) is None


@pytest.mark.parametrize(("offset", "nbytes"), [(0, 0), (3, PIN), (5, 3 * PIN), (PIN - 1, 2)])
def test_no_piece_crosses_a_pin_chunk(offset: int, nbytes: int) -> None:
    split = remedy.pieces(offset, nbytes, PIN)
    assert sum(length for _, length in split) == nbytes
    assert all((offset + start) // PIN == (offset + start + length - 1) // PIN
               for start, length in split)
    assert [start for start, _ in split] == [sum(n for _, n in split[:i])
                                            for i in range(len(split))]


def test_the_wait_remedy_orders_lmcaches_copy_after_the_producer(tmp_path: Path) -> None:
    cuda, log = FakeCuda(), remedy.RemedyLog(str(tmp_path / "remedy.jsonl"))
    wrapped = remedy.wrap("m:lmcache_memcpy_async", fallback(cuda.calls),
                          remedy.WAIT_PRODUCER, cuda, log)
    wrapped(1, 2, 64, "TransferDirection.D2H", 0, PIN)
    assert cuda.calls == [("wait_producer",), ("cudaMemcpy", 1, 2, 64)]
    assert [r["direction"] for r in remedy.read_log(tmp_path / "remedy.jsonl")
            if r["kind"] == "applied"] == ["D2H"]


def test_without_a_usable_cuda_device_the_copy_is_lmcaches_own(tmp_path: Path) -> None:
    cuda, log = FakeCuda(usable=False), remedy.RemedyLog(str(tmp_path / "remedy.jsonl"))
    for name in remedy.REMEDIES:
        remedy.wrap("m:f", fallback(cuda.calls), name, cuda, log)(1, 2, 8, "H2D", 0, PIN)
    assert cuda.calls == [("cudaMemcpy", 1, 2, 8)] * 2
    assert [r["kind"] for r in remedy.read_log(tmp_path / "remedy.jsonl")] == ["wrapped"] * 2


def test_lmcaches_own_fallback_runs_untouched_in_tensor_mode_and_the_cell_is_void(
        tmp_path: Path) -> None:
    """A copy the remedy does not cover (tensor mode: no raw pointers, no stream to order)
    reaches LMCache's fallback as it was, and a cell that saw only such copies is VOID."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("lmcache")
    from pytest_sharedkv.host.lmcache_api import direction, resolve

    log_path = tmp_path / "remedy.jsonl"
    log = remedy.RemedyLog(str(log_path))
    log.write({"kind": "armed", "remedy": remedy.CURRENT_STREAM})
    wrapped = remedy.wrap(remedy.PLACES[0], resolve("fallback lmcache_memcpy_async"),
                          remedy.CURRENT_STREAM, FakeCuda(), log)
    src = torch.arange(64, dtype=torch.uint8)
    dest = torch.zeros(64, dtype=torch.uint8)
    wrapped(dest, src, 64, direction("H2D"), 0, PIN)
    assert torch.equal(dest, src)
    assert remedy.void_problem(remedy.read_log(log_path), remedy.CURRENT_STREAM) == (
        "VOID: the current-stream remedy wrapped "
        "lmcache.v1.platform.torch_ops.mem_kernels:lmcache_memcpy_async but no pointer copy "
        "ran through it on a CUDA device (LMCache's compiled kernels bound, or an allocator "
        "whose copies are torch's own)")


@pytest.fixture
def fake_lmcache(tmp_path: Path) -> Iterator[Path]:
    """A package laid out as LMCache 0.5.6 keeps its fallback (a module and the package
    that star-imports it), under a name of its own."""
    root = tmp_path / "site" / "sharedkv_fake_ops"
    root.mkdir(parents=True)
    (root / "mem_kernels.py").write_text(
        "CALLS = []\n"
        "def lmcache_memcpy_async(dest, src, nbytes, direction, offset, alignment):\n"
        "    CALLS.append(nbytes)\n")
    (root / "__init__.py").write_text("from sharedkv_fake_ops.mem_kernels import *\n")
    sys.path.insert(0, str(root.parent))
    yield root
    sys.path.remove(str(root.parent))
    for name in [n for n in sys.modules if n.startswith("sharedkv_fake_ops")]:
        del sys.modules[name]


PLACES = ("sharedkv_fake_ops.mem_kernels:lmcache_memcpy_async",
          "sharedkv_fake_ops:lmcache_memcpy_async")


def test_installed_it_wraps_the_fallback_once_wherever_it_is_called_from(
        tmp_path: Path, fake_lmcache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    log_path = tmp_path / "remedy.jsonl"
    monkeypatch.setenv(remedy.LOG_ENV, str(log_path))
    cuda = FakeCuda()
    finder = remedy.install(remedy.WAIT_PRODUCER, cuda, places=PLACES)
    assert finder is not None
    try:
        package = importlib.import_module("sharedkv_fake_ops")
        package.lmcache_memcpy_async(1, 2, 48, "TransferDirection.H2D", 0, PIN)
    finally:
        sys.meta_path.remove(finder)
    assert package.mem_kernels.CALLS == [48]
    assert cuda.calls == [("wait_producer",)]  # once: the package holds the module's wrap
    assert remedy.TAG in getattr(package.lmcache_memcpy_async, MARK)
    records = remedy.read_log(log_path)
    assert [r["target"] for r in records if r["kind"] == "wrapped"] == [PLACES[0]]
    assert remedy.void_problem(records, remedy.WAIT_PRODUCER) is None
    assert remedy.void_problem(records, remedy.CURRENT_STREAM) is not None


def test_a_release_without_the_fallback_is_void_naming_where_it_looked(
        tmp_path: Path, fake_lmcache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    (fake_lmcache / "mem_kernels.py").write_text("def lmcache_memcpy_async_v2(*a): pass\n")
    log_path = tmp_path / "remedy.jsonl"
    monkeypatch.setenv(remedy.LOG_ENV, str(log_path))
    finder = remedy.install(remedy.CURRENT_STREAM, FakeCuda(), places=PLACES)
    assert finder is not None
    try:
        importlib.import_module("sharedkv_fake_ops")
    finally:
        sys.meta_path.remove(finder)
    assert remedy.void_problem(remedy.read_log(log_path), remedy.CURRENT_STREAM) == (
        "VOID: the current-stream remedy found no fallback lmcache_memcpy_async (looked in: "
        "sharedkv_fake_ops.mem_kernels:lmcache_memcpy_async; "
        "sharedkv_fake_ops:lmcache_memcpy_async)")


def test_an_unknown_remedy_is_refused_and_none_is_armed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log_path = tmp_path / "remedy.jsonl"
    monkeypatch.setenv(remedy.LOG_ENV, str(log_path))
    assert remedy.install("sync-everything", FakeCuda()) is None
    records = remedy.read_log(log_path)
    assert [r["kind"] for r in records] == ["error"]
    assert remedy.void_problem(records, "sync-everything") == (
        "VOID: the sync-everything remedy never loaded in the LMCache server")
    monkeypatch.delenv(remedy.REMEDY_ENV, raising=False)
    assert remedy.install() is None


def test_a_launched_process_arms_the_fault_hook_and_the_remedy_from_their_switches(
        tmp_path: Path) -> None:
    """The switches phase B sets on the LMCache server, read by the injected sitecustomize
    (nothing else imported: no LMCache here)."""
    import os
    import subprocess

    from pytest_sharedkv.engine_hooks import fault_hook
    from pytest_sharedkv.stack.launch.spec import INJECT_DIR

    env = {**os.environ, "PYTHONPATH": str(INJECT_DIR),
           fault_hook.CONTROL_ENV: str(tmp_path / "control.json"),
           fault_hook.LOG_ENV: str(tmp_path / "fault.jsonl"),
           remedy.REMEDY_ENV: remedy.WAIT_PRODUCER, remedy.LOG_ENV: str(tmp_path / "r.jsonl")}
    done = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False"]
    assert [r["kind"] for r in fault_hook.read_log(tmp_path / "fault.jsonl")] == ["armed"]
    assert [(r["kind"], r["remedy"]) for r in remedy.read_log(tmp_path / "r.jsonl")] == [
        ("armed", remedy.WAIT_PRODUCER)]
