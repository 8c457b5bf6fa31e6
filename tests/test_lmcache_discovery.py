"""The gpu_ops helpers that reach lmcache_memcpy_async are discovered, not listed: the
ordering tier probes each for both allocators and the fault-sensitivity hook delays each.
A newer LMCache is stood in for by a fake package with an ``h2d_range`` helper (the shape
of upstream's ``lmcache_memcpy_async_h2d_range``); discovery reads source, never imports.
A garbage SHAREDKV_INJECT_TARGETS is a usage error at the start of a run that uses sharedkv."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_sharedkv.engine_hooks import delay_hook
from pytest_sharedkv.host import lmcache_source

NEWER_GPU_OPS = '''
import torch
from lmcache import device_ops
import lmcache.lmcache_native as lmcache_native


def lmcache_memcpy_async_h2d(memory_obj, gpu_buffer):
    device_ops.lmcache_memcpy_async(gpu_buffer.data_ptr(), memory_obj.data_ptr, 1,
                                    lmcache_native.TransferDirection.H2D, 0, 1)


def lmcache_memcpy_async_d2h(gpu_buffer, memory_obj):
    device_ops.lmcache_memcpy_async(memory_obj.data_ptr, gpu_buffer.data_ptr(), 1,
                                    lmcache_native.TransferDirection.D2H, 0, 1)


def lmcache_memcpy_async_h2d_range(memory_obj, gpu_buffer, byte_offset, nbytes):
    if nbytes:
        device_ops.lmcache_memcpy_async(gpu_buffer.data_ptr() + byte_offset,
                                        memory_obj.data_ptr + byte_offset, nbytes,
                                        lmcache_native.TransferDirection.H2D, 0, 1)


def build_staging_copies(memory_objs, gpu_buffers, is_h2d):
    return [device_ops.StagingCopy(0, 0, 0, 0) for _ in memory_objs]
'''


def fake_lmcache(root: Path, package: str = "lmcache") -> Path:
    """A package tree PACKAGE.v1.gpu_connector.gpu_ops; importing it would fail loudly."""
    where = root / package / "v1" / "gpu_connector"
    where.mkdir(parents=True)
    (root / package / "__init__.py").write_text("raise ImportError('discovery imported me')\n")
    (root / package / "v1" / "__init__.py").write_text("")
    (where / "__init__.py").write_text("")
    (where / "gpu_ops.py").write_text(NEWER_GPU_OPS)
    return root


def test_discovery_reads_source_and_finds_every_helper(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(fake_lmcache(tmp_path, "sharedkv_newer_lmcache")))
    module = "sharedkv_newer_lmcache.v1.gpu_connector.gpu_ops"
    helpers = lmcache_source.memcpy_helpers(module)
    assert [(h.name, h.directions, h.short) for h in helpers] == [
        ("lmcache_memcpy_async_h2d", ("H2D",), "h2d"),
        ("lmcache_memcpy_async_d2h", ("D2H",), "d2h"),
        ("lmcache_memcpy_async_h2d_range", ("H2D",), "h2d-range"),
    ]
    assert "sharedkv_newer_lmcache" not in sys.modules
    assert lmcache_source.defines(module, "build_staging_copies") is True
    assert lmcache_source.defines(module, "nope") is False
    assert lmcache_source.defines("sharedkv_newer_lmcache.v1.missing", "f") is None
    assert not lmcache_source.importable("sharedkv_newer_lmcache.v1.missing")


def test_discovery_on_the_installed_lmcache_imports_nothing() -> None:
    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache not installed")
    code = ("import sys; from pytest_sharedkv.host.lmcache_source import memcpy_helpers; "
            "print(sorted(h.name for h in memcpy_helpers())); "
            "print(sorted(m for m in ('torch', 'lmcache') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()
    assert out == ["['lmcache_memcpy_async_d2h', 'lmcache_memcpy_async_h2d']", "[]"]


def test_code_objects_are_read_where_there_is_no_source() -> None:
    namespace: dict[str, object] = {}
    exec(compile("def f(x):\n    def g():\n        return ops.lmcache_memcpy_async(x)\n"
                 "    return g\n", "<compiled>", "exec"), namespace)
    f = namespace["f"]
    assert lmcache_source._code_mentions(f.__code__, "lmcache_memcpy_async")  # type: ignore[attr-defined]


def test_ordering_tier_and_hook_follow_a_newer_lmcache(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_lmcache(pytester.path / "newer")
    monkeypatch.setenv("PYTHONPATH", str(fake))
    listed = pytester.runpytest_subprocess("--sharedkv-list-targets", "-p", "no:cacheprovider")
    assert listed.ret == 0
    listed.stdout.fnmatch_lines([
        "*lmcache-lazy-helper *under-test*",
        "*lmcache-lazy-h2d-range *under-test*gpu_ops.lmcache_memcpy_async_h2d_range on a "
        "LazyMemoryAllocator object*[[]H2D only[]]*",
        "*lmcache-mixed-h2d-range *under-test*MixedMemoryAllocator object*[[]H2D only[]]*",
    ])
    hook = subprocess.run(
        [sys.executable, "-c", "from pytest_sharedkv.engine_hooks.delay_hook import parse_targets;"
         " print(parse_targets(None)['lmcache.v1.gpu_connector.gpu_ops'])"],
        capture_output=True, text=True, check=True, timeout=60,
        env={**__import__("os").environ, "PYTHONPATH": str(fake)}).stdout
    assert hook.strip() == ("['lmcache_memcpy_async_h2d', 'lmcache_memcpy_async_d2h', "
                            "'lmcache_memcpy_async_h2d_range']")


def test_ordering_matrix_probes_a_helper_only_in_its_direction(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_lmcache(pytester.path / "newer")))
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_sharedkv.suites", "-m", "ordering", "--collect-only", "-q",
        "--sharedkv-targets=lmcache-lazy-h2d-range", "--sharedkv-sizes=4KiB",
        "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*test_copy_path_is_stream_ordered[[]lmcache-lazy-h2d-range-H2D"
                                 "-4KiB[]]", "1/* tests collected*"])


def test_the_hooks_defaults_are_the_discovered_helpers() -> None:
    targets = delay_hook.parse_targets(None)
    helpers = [h.name for h in lmcache_source.memcpy_helpers()]
    assert targets.get(lmcache_source.GPU_OPS, []) == helpers
    assert "_transfer_per_layer_fused" in targets["lmcache.v1.platform.torch_ops.mp_mem_kernels"]


@pytest.mark.parametrize(("value", "message"), [
    ("lmcache.v1.gpu_connector.gpu_ops", "'lmcache.v1.gpu_connector.gpu_ops' is not "
                                         "module:function"),
    ("a.b:f,,:g", "':g' is not module:function"),
    ("lmcache.v1.gpu_connector.gpu_ops:no_such_helper",
     "lmcache.v1.gpu_connector.gpu_ops has no no_such_helper"),
    ("lmcache.v1.no_such_module:f", "no module lmcache.v1.no_such_module"),
])
def test_garbage_inject_targets_are_a_usage_error(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch, value: str,
                                                  message: str) -> None:
    if "lmcache" in value and "no_such" in value and importlib.util.find_spec("lmcache") is None:
        pytest.skip("existence is checked where lmcache is importable")
    monkeypatch.setenv(delay_hook.TARGETS_ENV, value)
    pytester.makepyfile("import pytest\n\n@pytest.mark.replica_pair\ndef test_x():\n    pass\n")
    # a sharedkv item makes the run active (tests/test_stack_fixtures.py: other runs)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {delay_hook.TARGETS_ENV}={value}: *{message}*"])
    result.stdout.no_fnmatch_line("*passed*")


def test_good_inject_targets_pass(pytester: pytest.Pytester,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(delay_hook.TARGETS_ENV,
                       "lmcache.v1.gpu_connector.gpu_ops:lmcache_memcpy_async_d2h")
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_fake_package_really_refuses_import(tmp_path: Path) -> None:
    fake = fake_lmcache(tmp_path, "sharedkv_refusing_lmcache")
    code = textwrap.dedent("""
        import sys
        try:
            import sharedkv_refusing_lmcache
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=fake, check=True, timeout=60).stdout
    assert out.strip() == "discovery imported me"


def test_a_helper_is_called_with_its_arguments_bound_by_name() -> None:
    pytest.importorskip("torch")
    import torch

    from pytest_sharedkv.ordering.lmcache_copies import bind_helper

    calls: list[tuple[object, ...]] = []

    def lmcache_memcpy_async_h2d_range(memory_obj: object, gpu_buffer: torch.Tensor,
                                       byte_offset: int, nbytes: int) -> None:
        calls.append((memory_obj, gpu_buffer.nbytes, byte_offset, nbytes))

    def lmcache_memcpy_async_d2h(gpu_buffer: torch.Tensor, memory_obj: object,
                                 stream: object = None) -> None:
        calls.append((memory_obj, gpu_buffer.nbytes, stream))

    dev = torch.zeros(4096, dtype=torch.uint8)
    bind_helper(lmcache_memcpy_async_h2d_range, "h2d_range")("obj", dev)
    bind_helper(lmcache_memcpy_async_d2h, "d2h")("obj", dev)
    assert calls == [("obj", 4096, 0, 4096), ("obj", 4096, None)]

    def lmcache_memcpy_async_h2d_strided(memory_obj: object, gpu_buffer: torch.Tensor,
                                         stride: int) -> None:
        pass

    with pytest.raises(TypeError, match="does not know what to pass for 'stride'"):
        bind_helper(lmcache_memcpy_async_h2d_strided, "h2d_strided")
