"""GPU/package needs become precise skips, and failures under --sharedkv-require-gpu."""

from __future__ import annotations

from collections.abc import Callable

import pytest

GATED = """
import pytest

@pytest.mark.sharedkv_gpu
def test_one_gpu(sharedkv_gpu_lease):
    pass

@pytest.mark.sharedkv_gpu(count=2)
def test_two_gpus(sharedkv_gpu_lease):
    assert len(set(sharedkv_gpu_lease.tokens)) == 2

@pytest.mark.sharedkv_gpu(min_free_gib=40)
def test_big_gpu(sharedkv_gpu_lease):
    pass

@pytest.mark.sharedkv_requires("sharedkv_no_such_module")
def test_needs_module():
    pass

@pytest.mark.sharedkv_gpu
def test_unsupported_layout_is_xfail(sharedkv_gpu_lease):
    pytest.xfail("NHD with packed pages unsupported by this LMCache")

def test_ungated():
    pytest.skip("an ordinary skip")
"""


def test_skip_reasons_without_devices(pytester: pytest.Pytester,
                                      fake_gpus: Callable[[str], None]) -> None:
    fake_gpus("")
    pytester.makepyfile(GATED)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines_random([
        "*needs 1 CUDA device, 0 visible (SHAREDKV_FAKE_GPUS)",
        "*needs 2 CUDA devices, 0 visible (SHAREDKV_FAKE_GPUS)",
        "*sharedkv_no_such_module not importable: ModuleNotFoundError: No module named*",
    ])


def test_skip_reasons_with_one_small_device(pytester: pytest.Pytester,
                                            fake_gpus: Callable[[str], None]) -> None:
    fake_gpus("0:12")
    pytester.makepyfile(GATED)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)
    result.stdout.fnmatch_lines_random([
        "*needs 2 CUDA devices, 1 visible (SHAREDKV_FAKE_GPUS)",
        "*needs 40 GiB free on each device; device 0 (fake-gpu-0) has 12.0 GiB free",
    ])


def test_require_gpu_turns_gated_skips_into_failures(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    fake_gpus("0:12")
    pytester.makepyfile(GATED)
    result = pytester.runpytest("--sharedkv-require-gpu", "-rs")
    # gated skips fail (failures in pytest's count, as the README says, even at setup);
    # xfail stays xfail; the ungated skip stays a skip
    result.assert_outcomes(passed=1, failed=3, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines_random([
        "*--sharedkv-require-gpu: a GPU/lmcache/vllm-gated test may not skip*",
        "*an ordinary skip",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_require_gpu_from_ini(pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
                              ) -> None:
    fake_gpus("")
    pytester.makeini("[pytest]\nsharedkv_require_gpu = true\n")
    pytester.makepyfile(GATED)
    result = pytester.runpytest()
    result.assert_outcomes(failed=5, skipped=1)


def test_skip_inside_a_gated_test_also_fails_under_require_gpu(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    fake_gpus("0")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.sharedkv_gpu
        def test_tier_finds_no_cuda():
            pytest.skip("torch sees no CUDA device")
    """)
    assert pytester.runpytest().parseoutcomes() == {"skipped": 1}
    result = pytester.runpytest("--sharedkv-require-gpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*torch sees no CUDA device*"])


def test_bad_fake_spec_is_one_usage_error(pytester: pytest.Pytester,
                                         fake_gpus: Callable[[str], None]) -> None:
    fake_gpus("zero")
    pytester.makepyfile("import pytest\n@pytest.mark.sharedkv_gpu\ndef test_x(): pass\n"
                        "@pytest.mark.sharedkv_gpu\ndef test_y(): pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: SHAREDKV_FAKE_GPUS='zero': 'zero' is not a device "
                                 "index; it takes device indices, e.g. 0,1*"])
    assert "PASSED" not in result.stdout.str() and "Traceback" not in result.stderr.str()


def test_gpus_option_must_name_visible_devices(pytester: pytest.Pytester,
                                               fake_gpus: Callable[[str], None]) -> None:
    fake_gpus("0,1")
    pytester.makepyfile("import pytest\n@pytest.mark.sharedkv_gpu\ndef test_x(): pass\n")
    result = pytester.runpytest("--sharedkv-gpus=3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sharedkv-gpus names device '3', which is not among*"
                                 "it takes indices or UUIDs of visible devices"])
    pytester.runpytest("--sharedkv-gpus=1").assert_outcomes(passed=1)


def test_lease_fixture_needs_the_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(sharedkv_gpu_lease): pass")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*sharedkv_gpu_lease needs @pytest.mark.sharedkv_gpu*"])


def test_gated_skips_point_at_the_tests(pytester: pytest.Pytester,
                                        fake_gpus: Callable[[str], None]) -> None:
    """-ra groups skips by where they point: a gated skip points at its test (as a skip
    mark does), never at the plugin's gating.py."""
    fake_gpus("")
    pytester.makepyfile(test_gated=GATED)
    result = pytester.runpytest("-ra", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines([
        "SKIPPED [[]1[]] test_gated.py:3: needs 1 CUDA device, 0 visible*",
        "SKIPPED [[]1[]] test_gated.py:7: needs 2 CUDA devices, 0 visible*",
        "SKIPPED [[]1[]] test_gated.py:15: sharedkv_no_such_module not importable*",
    ], consecutive=False)
    assert "gating.py" not in result.stdout.str()


def test_a_lease_points_only_its_own_test_at_its_devices(
        pytester: pytest.Pytester, fake_gpus: Callable[[str], None]) -> None:
    """The test's CUDA_VISIBLE_DEVICES (and device order) are its lease's while it runs,
    and the process's own again after: no binding outlives the test that needed it."""
    fake_gpus("0,1")
    pytester.makepyfile("""
        import os
        import pytest

        @pytest.mark.sharedkv_gpu(count=2)
        def test_leased(sharedkv_gpu_lease):
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
            assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"

        def test_after():
            assert "CUDA_VISIBLE_DEVICES" not in os.environ
            assert "CUDA_DEVICE_ORDER" not in os.environ
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
