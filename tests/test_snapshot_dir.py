"""--snapshot-update never writes the service tier's references into an installed package:
without --sharedkv-snapshot-dir it is a usage error naming that option, before any test;
a checkout (an editable install) keeps writing into its fixtures/ as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sharedkv.service import references

SERVICE_TEST = "import pytest\n\n@pytest.mark.service_regression\ndef test_x():\n    pass\n"
OTHER_TEST = "import pytest\n\n@pytest.mark.packed_page\ndef test_y():\n    pass\n"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The default reference directory as a non-editable install has it."""
    root = tmp_path / "venv/lib/python3.11/site-packages/pytest_sharedkv/fixtures/snapshots"
    monkeypatch.setattr(references, "default_root", lambda: root)
    return root


def test_where_updating_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "prefix" / "lib"
    assert references.installed_problem(site / "pkg" / "snapshots", (site,)) is not None
    assert references.installed_problem(tmp_path / "site-packages" / "x", ()) is not None
    assert references.installed_problem(tmp_path / "dist-packages" / "x", ()) is not None
    assert references.installed_problem(tmp_path / "checkout" / "fixtures" / "snapshots",
                                        (site,)) is None
    # this checkout's editable install: --snapshot-update writes into fixtures/ as before
    assert references.installed_problem(references.default_root()) is None


@pytest.mark.usefixtures("installed")
def test_updating_into_an_installed_package_is_a_usage_error(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SERVICE_TEST)
    result = pytester.runpytest_inprocess("--snapshot-update", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --snapshot-update would write the service tier's "
                                 "stored references into the installed package (*site-packages*"
                                 "), which * give --sharedkv-snapshot-dir DIR *"])
    assert "passed" not in result.stdout.str()
    assert "Traceback" not in result.stderr.str()


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(("test", "args"), [
    (SERVICE_TEST, ["--snapshot-update", "--sharedkv-snapshot-dir", "refs"]),
    (SERVICE_TEST, []),  # no update: the shipped references are only read
    (OTHER_TEST, ["--snapshot-update"]),  # no service test: no reference is written
])
def test_updating_with_a_directory_or_nothing_to_write_runs(
        pytester: pytest.Pytester, test: str, args: list[str]) -> None:
    pytester.makepyfile(test)
    result = pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
