"""LMCache's kernel path is read from what each release has: ``lmcache.device_ops`` and
``cuda_ops`` (0.5.4 on), ``resolve_device_ops`` and ``c_ops`` (0.5.3), or neither (said as
unknown, naming what is missing). Fake LMCache packages stand in for the releases; the
probe runs in a child, as the header's does, with a stand-in torch (a CUDA build with no
device) so that it takes a fraction of a second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_sharedkv.host.lmcache_status import LMCacheStatus

FAKE_TORCH = '''
__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
class cuda:
    @staticmethod
    def is_available():
        return False
'''
OPS = '''
class CudaDeviceOps:
    def __init__(self, bound):
        self.bound = bound
    def ensure_native(self):
        if self.bound:
            self.lmcache_memcpy_async = lambda *a: None
'''


def fake_release(root: Path, layout: str, bound: bool, so: str | None) -> Path:
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(FAKE_TORCH)
    pkg = root / "lmcache"
    pkg.mkdir(parents=True)
    init = f'__version__ = "{layout}"\ntorch_device_type = "cuda"\n'
    if layout == "0.5.6":
        init += OPS + f"device_ops = CudaDeviceOps({bound})\n"
    (pkg / "__init__.py").write_text(init)
    if layout == "0.5.3":
        platform = pkg / "v1" / "platform"
        platform.mkdir(parents=True)
        (pkg / "v1" / "__init__.py").write_text("")
        (platform / "__init__.py").write_text(
            OPS + f"_ops = CudaDeviceOps({bound})\n"
            "def resolve_device_ops(device_type):\n    return _ops\n")
    if so is not None:  # a file that is no loadable extension: its import fails
        (pkg / f"{so}.cpython-312-x86_64-linux-gnu.so").write_text("not an ELF file")
    return root


def probe_in(root: Path) -> LMCacheStatus:
    out = subprocess.run([sys.executable, "-m", "pytest_sharedkv.host.lmcache_status"],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    line = next(x for x in out.stdout.splitlines() if x.startswith("SHAREDKV-STATUS "))
    return LMCacheStatus.from_json(line.split(" ", 1)[1])


@pytest.mark.parametrize(("layout", "bound", "so", "path", "module"), [
    ("0.5.6", True, "cuda_ops", "compiled", "lmcache.cuda_ops"),
    ("0.5.6", False, "cuda_ops", "torch-fallback", "lmcache.cuda_ops"),
    ("0.5.3", True, "c_ops", "compiled", "lmcache.c_ops"),
    ("0.5.3", False, "c_ops", "torch-fallback", "lmcache.c_ops"),
    ("0.4.0", False, None, "unknown", None),
])
def test_each_release_layout_gives_its_kernel_path(tmp_path: Path, layout: str, bound: bool,
                                                   so: str | None, path: str,
                                                   module: str | None) -> None:
    status = probe_in(fake_release(tmp_path, layout, bound, so))
    assert (status.kernel_path, status.kernel_module) == (path, module)
    text = status.describe()
    if path == "compiled":
        assert text == f"{module} loaded: LMCache {layout} copies run its compiled kernels"
        assert status.key() == f"lmcache-{layout}-compiled-{str(module).rsplit('.', 1)[1]}"
    elif path == "torch-fallback":
        assert text.startswith(f"{module} NOT loaded (") and "torch fallback" in text
        assert status.cuda_ops_error  # why: the fake .so does not load
        assert status.key() == f"lmcache-{layout}-torch-fallback"
    else:
        assert "kernel path unknown (neither lmcache.device_ops nor" in text
        assert status.data()["kernel_path"] == "unknown"


def test_no_lmcache_is_not_installed() -> None:
    status = LMCacheStatus(error="ModuleNotFoundError: No module named 'lmcache'")
    assert status.kernel_path == "not-installed"
    assert status.key() == "lmcache-none-not-installed"


class _Pair:
    labels = {"provider": "vllm"}
    topology = None  # the shared topology


def test_reference_key_names_the_kernel_path() -> None:
    from pytest_sharedkv.service.references import engine_key

    fallback = LMCacheStatus(lmcache_version="0.5.6", kernel_module="lmcache.cuda_ops",
                             native_bound=False, cuda_ops_error="ImportError: undefined symbol")
    compiled = LMCacheStatus(lmcache_version="0.5.6", kernel_module="lmcache.cuda_ops",
                             native_bound=True)
    keys = {engine_key(_Pair(), s)  # type: ignore[arg-type]
            for s in (fallback, compiled, "lmcache.cuda_ops: not checked (no CUDA device)")}
    assert len(keys) == 3
    assert any(k.endswith("+lmcache-0.5.6-torch-fallback") for k in keys)
    assert any(k.endswith("+lmcache-0.5.6-compiled-cuda_ops") for k in keys)


def test_the_json_report_keeps_lmcache_as_data(pytester: pytest.Pytester) -> None:
    import json

    pytester.makepyfile("import pytest\n\n@pytest.mark.packed_page\ndef test_x():\n    pass\n")
    result = pytester.runpytest("--sharedkv-json", "r.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    lmcache = json.loads((pytester.path / "r.json").read_text())["environment"]["lmcache"]
    assert set(lmcache) == {"version", "kernel_path", "kernel_module", "key", "why"}
    assert lmcache["kernel_path"] in {"not-checked", "not-installed"}
    assert lmcache["why"]
