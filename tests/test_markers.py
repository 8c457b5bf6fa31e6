"""Markers are registered with their signatures and pass --strict-markers."""

from __future__ import annotations

import pytest

from pytest_sharedkv.config.markers import TIER_MARKERS


def test_markers_listed_with_signatures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines([
        *(f"@pytest.mark.{name}: sharedkv tier - *" for name in TIER_MARKERS),
        "@pytest.mark.sharedkv_gpu(count=1, min_free_gib=None): *",
        "@pytest.mark.sharedkv_requires(*distributions): *",
    ])


def test_strict_markers_clean(pytester: pytest.Pytester) -> None:
    marks = "\n".join(f"@pytest.mark.{name}" for name in TIER_MARKERS)
    pytester.makepyfile(f"""
        import pytest

        {marks.replace(chr(10), chr(10) + '        ')}
        def test_all_tiers():
            pass
    """)
    result = pytester.runpytest("--strict-markers", "-m", " or ".join(TIER_MARKERS))
    result.assert_outcomes(passed=1)


def test_unknown_marker_still_caught(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.sharedkv_gpus\ndef test_x(): pass\n")
    result = pytester.runpytest("--strict-markers")
    result.stdout.fnmatch_lines(["*'sharedkv_gpus' not found in `markers`*"])


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        ("sharedkv_gpu(count=0)", "*sharedkv_gpu(count=...) must be an int >= 1*"),
        ("sharedkv_gpu(2, 3, 4)", "*sharedkv_gpu takes (count=1, min_free_gib=None)*"),
        ("sharedkv_gpu(min_free_gib=-1)", "*min_free_gib=...) must be a number > 0*"),
        ("sharedkv_requires(3)", "*sharedkv_requires takes module names as strings*"),
    ],
)
def test_bad_marker_arguments(pytester: pytest.Pytester, mark: str, message: str) -> None:
    pytester.makepyfile(f"import pytest\n@pytest.mark.{mark}\ndef test_x(): pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str() and "markers.py" not in result.stdout.str()


def test_require_gpu_fails_a_missing_device_not_an_option_left_off(
        pytester: pytest.Pytester) -> None:
    """--sharedkv-require-gpu turns a gated test's skip into a failure when hardware or a
    package is missing; a skip because an option is off (the triage, the KV audit) or
    there is nothing to do stays a skip (on an H200 "triage is off" failed a clean run)."""
    pytester.makepyfile("""
        import pytest
        from pytest_sharedkv.config.markers import skip_not_asked

        @pytest.mark.sharedkv_requires("pytest")  # gated, and satisfied here
        def test_option_off(request):
            skip_not_asked(request.node, "the audit is off")

        @pytest.mark.sharedkv_requires("pytest")
        def test_no_device():
            pytest.skip("no CUDA device")
    """)
    result = pytester.runpytest("--sharedkv-require-gpu", "-p", "no:cacheprovider", "-rsf")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*off.py:4: the audit is off"])  # at the test
    result.stdout.fnmatch_lines(["*FAILED*test_no_device*"])
