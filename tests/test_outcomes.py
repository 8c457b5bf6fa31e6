"""Outcomes are true: what the sharedkv summary and the JSON report say matches pytest's own
count, an interrupted test is never passed, and tiers come from markers, not folder names."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

INTERRUPTED = """
import os, signal, time
import pytest

@pytest.mark.packed_page
def test_interrupted_before_it_fails():
    os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C (or a CI cancel) sends
    time.sleep(5)
    assert False, "never reached"
"""


def _report(pytester: pytest.Pytester) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / "report.json").read_text())
    return data


def _pytest_counts(outcomes: dict[str, int]) -> dict[str, int]:
    keys = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
    return {k: outcomes.get(k, 0) for k in keys}


def test_an_interrupted_test_is_not_passed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(INTERRUPTED)
    result = pytester.runpytest_subprocess("--sharedkv-json=report.json", "-p", "no:xdist",
                                           "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*no tests ran*"])
    result.stdout.fnmatch_lines([
        "*sharedkv summary*",
        "INTERRUPTED (KeyboardInterrupt): 1 test has no outcome*",
        "[[]packed_page[]] tests: none finished",
        "  no outcome (1): *test_interrupted_before_it_fails",
    ])
    assert "1 passed" not in result.stdout.str()
    data = _report(pytester)
    assert data["complete"] is False
    assert data["interrupted"] == "KeyboardInterrupt"
    assert data["exitstatus"] == int(pytest.ExitCode.INTERRUPTED)
    assert data["summary"] == _pytest_counts({})
    assert [t["outcome"] for t in data["tests"]] == [None]


def test_a_stopped_run_is_not_complete(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.ordering
        def test_fails():
            assert False

        @pytest.mark.ordering
        def test_never_runs():
            pass
    """)
    result = pytester.runpytest_subprocess("--sharedkv-json=report.json", "-x", "-p",
                                           "no:cacheprovider")
    result.assert_outcomes(failed=1)
    data = _report(pytester)
    assert data["complete"] is False
    assert data["interrupted"] == "stopping after 1 failures"
    assert data["summary"] == _pytest_counts({"failed": 1})


def test_tiers_come_from_markers_not_folders(pytester: pytest.Pytester) -> None:
    for folder in ("perf", "ordering"):
        path = pytester.path / "tests" / folder
        path.mkdir(parents=True)
        (path / f"test_{folder}_x.py").write_text("def test_plain():\n    pass\n")
    pytester.path.joinpath("tests/test_marked.py").write_text(
        "import pytest\n\n@pytest.mark.pinned_pool\ndef test_marked():\n    pass\n")
    result = pytester.runpytest_subprocess("tests", "--sharedkv-json=report.json", "-p",
                                           "no:cacheprovider")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "[perf]" not in out and "[ordering]" not in out
    result.stdout.fnmatch_lines(["[[]pinned_pool[]] tests: 1 passed"])
    tiers = {t["nodeid"]: t["tier"] for t in _report(pytester)["tests"]}
    assert sorted(tiers.values(), key=str) == [None, None, "pinned_pool"]


GATED = """
import pytest

@pytest.mark.ordering
@pytest.mark.sharedkv_gpu
def test_needs_a_gpu():
    pass

@pytest.mark.ordering
@pytest.mark.sharedkv_gpu
def test_skips_in_the_call(sharedkv_gpu_lease):
    pass

@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")

@pytest.mark.ordering
def test_setup_error(broken):
    pass
"""


def test_require_gpu_skips_are_failures_and_errors_have_reasons(
    pytester: pytest.Pytester, fake_gpus: Callable[[str], None]
) -> None:
    fake_gpus("")
    pytester.makepyfile(GATED)
    result = pytester.runpytest_subprocess("--sharedkv-require-gpu", "--sharedkv-json=report.json",
                                           "-p", "no:cacheprovider")
    # pytest's own count: the two gated skips are failures, the broken fixture an error
    result.assert_outcomes(failed=2, errors=1)
    result.stdout.fnmatch_lines([
        "[[]ordering[]] tests: 2 failed, 1 error",
        "  failed under --sharedkv-require-gpu (2): needs 1 CUDA device, 0 visible*",
        "  error (1): RuntimeError: the fixture broke",
    ])
    data = _report(pytester)
    assert data["summary"] == _pytest_counts(result.parseoutcomes())


@pytest.mark.parametrize("workers", [None, "2"])
def test_json_counts_equal_pytests_counts(pytester: pytest.Pytester,
                                          workers: str | None) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.packed_page
        @pytest.mark.parametrize("i", range(3))
        def test_passes(i):
            pass

        @pytest.mark.packed_page
        def test_fails():
            assert False

        @pytest.mark.packed_page
        def test_skips():
            pytest.skip("not here")

        @pytest.mark.packed_page
        @pytest.mark.xfail(reason="known", strict=True)
        def test_xfails():
            assert False

        @pytest.mark.packed_page
        @pytest.mark.xfail(reason="unknown", strict=False)
        def test_xpasses():
            pass

        @pytest.fixture
        def broken_teardown():
            yield
            raise RuntimeError("teardown broke")

        @pytest.mark.packed_page
        def test_fails_and_errors(broken_teardown):
            assert False
    """)
    args = ["--sharedkv-json=report.json", "-p", "no:cacheprovider"]
    if workers:
        args += ["-n", workers]
    result = pytester.runpytest_subprocess(*args)
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 2 and outcomes["errors"] == 1
    data = _report(pytester)
    assert data["complete"] is True
    assert data["summary"] == _pytest_counts(outcomes)
    assert data["tiers"]["packed_page"]["summary"] == data["summary"]


def test_a_crashed_worker_counts_as_pytest_counts_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import os
        import pytest

        @pytest.mark.packed_page
        def test_crashes_its_worker():
            os._exit(3)

        @pytest.mark.packed_page
        @pytest.mark.parametrize("i", range(3))
        def test_passes(i):
            pass
    """)
    result = pytester.runpytest_subprocess("--sharedkv-json=report.json", "-n", "2", "-p",
                                           "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed") == 3
    data = _report(pytester)
    assert data["summary"] == _pytest_counts(outcomes)
    crashed = next(t for t in data["tests"] if "crashes" in t["nodeid"])
    assert crashed["outcome"] == "failed" and crashed["tier"] == "packed_page"
    assert "crashed" in crashed["message"]
    result.stdout.fnmatch_lines(["[[]packed_page[]] tests: 3 passed, 1 failed"])
