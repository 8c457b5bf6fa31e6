"""The stack's pytest module is a good citizen until the run is active: a stale
SHAREDKV_INJECT_TARGETS in the shell changes nothing in a project's own run, and becomes a
usage error before any test once a sharedkv item is collected (under xdist too); the
generated model goes in the run's own temp directory, never in the one every run shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sharedkv.stack.fixtures import TARGETS_ENV

BAD = "not-a-target"
SHAREDKV_TEST = """
import pytest

@pytest.mark.replica_pair
def test_sharedkv():
    pass

def test_own():
    pass
"""


def test_a_stale_targets_variable_leaves_a_project_run_alone(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TARGETS_ENV, BAD)
    pytester.makepyfile("def test_own():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert BAD not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("xdist", [[], ["-n", "1"]], ids=["plain", "xdist"])
def test_a_bad_targets_variable_stops_a_run_at_its_first_sharedkv_item(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: list[str]) -> None:
    monkeypatch.setenv(TARGETS_ENV, BAD)
    pytester.makepyfile(SHAREDKV_TEST)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *xdist)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {TARGETS_ENV}={BAD}: *not module:function*"])
    result.stdout.no_fnmatch_line("*passed*")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


MODEL_TEST = """
from pytest_sharedkv.stack.fixtures import model_dir


def _maker():
    def make(path):
        path.mkdir()
        (path / "model.safetensors").write_text("")
    return "k", make


def test_model(pytestconfig, tmp_path_factory):
    path = model_dir(pytestconfig, tmp_path_factory, "fake", _maker)
    print("MODEL AT", path)
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "1"]], ids=["plain", "xdist"])
def test_the_generated_model_stays_in_the_runs_own_temp_directory(
        pytester: pytest.Pytester, xdist: list[str]) -> None:
    pytester.makepyfile(MODEL_TEST)
    basetemp = pytester.path / "run-temp"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-s",
                                          f"--basetemp={basetemp}", *xdist)
    result.assert_outcomes(passed=1)
    made = list(pytester.path.rglob("sharedkv-fake-model-k"))
    assert made == [basetemp / "sharedkv-fake-model-k"], made
    assert (made[0] / "model.safetensors").exists()
    assert not list(Path(basetemp.parent).glob("sharedkv-*")), "outside the run's own"
