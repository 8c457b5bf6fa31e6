"""The report header names versions, GPUs and whether LMCache runs its compiled kernels."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable

import pytest

from pytest_sharedkv.host.lmcache_status import LMCacheStatus


def test_header_on_a_machine_without_gpus(pytester: pytest.Pytester,
                                          fake_gpus: Callable[[str], None]) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.packed_page\ndef test_x(): pass")
    result = pytester.runpytest()
    # no sharedkv option given: the header comes once sharedkv items are collected
    result.stdout.fnmatch_lines([
        "collected 1 item",
        "sharedkv: torch * lmcache *; vllm *; xdist *",
        "sharedkv: GPUs: no CUDA device visible (SHAREDKV_FAKE_GPUS)",
        "sharedkv: lmcache*",
    ])
    # with a sharedkv option, before collection, as pytest's other header lines
    early = pytester.runpytest("--sharedkv-trials=3")
    early.stdout.fnmatch_lines(["sharedkv: torch * lmcache *; vllm *; xdist *", "collected *"])


def test_header_under_xdist_without_options_is_in_the_summary(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.packed_page\ndef test_x(): pass")
    result = pytester.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "*sharedkv summary*",
        "sharedkv: torch * lmcache *; vllm *; xdist *",
        "sharedkv: GPUs: no CUDA device visible (SHAREDKV_FAKE_GPUS)",
        "[[]packed_page[]] tests: 1 passed",
    ])


READ = ("import sys; from pytest_sharedkv.host.environment import torch_build; "
        "print(repr((torch_build(), 'torch' in sys.modules)))")


def test_torch_build_read_without_import() -> None:
    """In a fresh interpreter (this one may have imported torch, or not), the text read
    imports nothing of torch; it gives what importing torch gives (torch's own answer is
    read here: the same interpreter and installed torch, without a second interpreter that
    imports it)."""
    torch = pytest.importorskip("torch", reason="compared with the installed torch's own answer")

    out = subprocess.run([sys.executable, "-c", READ], capture_output=True, text=True,
                         timeout=300, check=True)
    read = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert read == ((torch.__version__, torch.version.cuda), False)


def test_fallback_is_said_plainly() -> None:
    status = LMCacheStatus(
        lmcache_version="0.5.6", torch_version="2.11.0+cu130", cuda_available=True,
        device_ops="CudaDeviceOps", native_bound=False,
        cuda_ops_error="ImportError: .../cuda_ops.so: undefined symbol: _ZN3c10...",
    )
    assert status.on_torch_fallback
    text = status.describe()
    assert text.startswith("lmcache.cuda_ops NOT loaded (ImportError: ")
    assert "torch fallback" in text and "cudaMemcpy with no stream" in text
    native = LMCacheStatus(lmcache_version="0.5.6", native_bound=True)
    assert not native.on_torch_fallback
    assert native.describe().startswith("lmcache.cuda_ops loaded")
    assert LMCacheStatus.from_json(status.to_json()) == status


def test_status_probe_runs_as_a_subprocess() -> None:
    pytest.importorskip("lmcache", reason="the probe reports on an installed lmcache")
    out = subprocess.run([sys.executable, "-m", "pytest_sharedkv.host.lmcache_status"],
                         capture_output=True, text=True, timeout=300, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("SHAREDKV-STATUS "))
    status = LMCacheStatus.from_json(line.split(" ", 1)[1])
    assert status.lmcache_version and status.torch_version
    assert status.error is None
