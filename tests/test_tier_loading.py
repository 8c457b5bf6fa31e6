"""The tiers' pytest modules are registered when the run first needs them: never in a
project without sharedkv tests, before its conftests where a sharedkv option is given,
before the first function collection finds that a tier may parametrize, and at the latest
when the collected items make the run active. What the plugin registers for a run goes at
unconfigure."""

from __future__ import annotations

import pytest

from pytest_sharedkv.plugin import COLLECTOR, TIER_LOADER, TIER_PLUGINS

# An inner plugin that records which of the plugin's parts are registered at configure (after
# the plugin's own), at the session's end and after the plugin's unconfigure.
WATCH = """
import pytest

NAMES = NAMES_HERE
OWN = OWN_HERE


def _seen(config):
    return sorted(n for n in NAMES if config.pluginmanager.get_plugin(n) is not None)


def pytest_configure(config):
    print("AT CONFIGURE", _seen(config))


def pytest_sessionfinish(session):
    print("AT SESSIONFINISH", _seen(session.config))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    print("AFTER UNCONFIGURE", [n for n in _seen(config) if n in OWN])
""".replace("NAMES_HERE", repr((*TIER_PLUGINS, COLLECTOR, TIER_LOADER))).replace(
    "OWN_HERE", repr({COLLECTOR, TIER_LOADER}))
TIERS = sorted(TIER_PLUGINS)


def line(label: str, names: list[str], anywhere: bool = False) -> str:
    """The fnmatch pattern of WATCH's line LABEL NAMES ([ and ] taken literally)."""
    text = f"{label} {sorted(names)}".replace("[", "\x00").replace("]", "[]]")
    return ("*" if anywhere else "") + text.replace("\x00", "[[]")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeconftest(WATCH)
    return pytester.runpytest_inprocess("-s", "-p", "no:cacheprovider", *args)


def test_a_project_without_sharedkv_tests_never_registers_the_tiers(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([line("AT CONFIGURE", [COLLECTOR, TIER_LOADER]),
                                 line("AT SESSIONFINISH", [COLLECTOR, TIER_LOADER], True),
                                 line("AFTER UNCONFIGURE", [])])


def test_a_sharedkv_option_registers_them_before_the_conftests(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = _run(pytester, "--sharedkv-trials=3")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([line("AT CONFIGURE", [*TIERS, COLLECTOR]),
                                 line("AFTER UNCONFIGURE", [])])
    listed = pytester.runpytest_inprocess("--sharedkv-list-targets", "-p", "no:cacheprovider")
    assert listed.ret == 0
    assert "tensor-copy" in listed.stdout.str() and "passed" not in listed.stdout.str()


@pytest.mark.parametrize("source", [
    # a function's own marker
    "import pytest\n\n@pytest.mark.packed_page\ndef test_packed(sharedkv_packed_case):\n"
    "    pass\n",
    # a class's marker, the function defined first in the class
    "import pytest\n\n@pytest.mark.packed_page\nclass TestPacked:\n"
    "    def test_packed(self, sharedkv_packed_case):\n        pass\n",
    # the module's marker
    "import pytest\n\npytestmark = pytest.mark.packed_page\n\n"
    "def test_packed(sharedkv_packed_case):\n    pass\n",
], ids=["function-mark", "class-mark", "module-mark"])
def test_collection_registers_them_before_a_tier_parametrizes(pytester: pytest.Pytester,
                                                              source: str) -> None:
    """The first marked function is parametrized by its tier (one item per layout and
    path), so the tiers were there before pytest worked out its fixtures."""
    pytester.makepyfile(source)
    result = _run(pytester, "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()
    collected = [line for line in result.stdout.lines if "test_packed[" in line]
    assert len(collected) > 10, result.stdout.str()


@pytest.mark.parametrize("source", [
    "def test_salt(sharedkv_kv_namespace):\n    assert sharedkv_kv_namespace('a')\n",
    "import pytest\n\n@pytest.fixture\ndef salts(sharedkv_kv_namespace):\n"
    "    return sharedkv_kv_namespace\n\n\ndef test_salt(salts):\n    assert salts('a')\n",
], ids=["named-by-the-test", "through-a-user-fixture"])
def test_a_tier_fixture_without_a_marker_is_found(pytester: pytest.Pytester,
                                                  source: str) -> None:
    """Named by the test, the tiers come at collection; reached only through a user's
    fixture, once the items have made the run active (pytest finds it at setup)."""
    pytester.makepyfile(source)
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([line("AT SESSIONFINISH", [*TIERS, COLLECTOR], True),
                                 line("AFTER UNCONFIGURE", [])])


@pytest.mark.parametrize("workers", [None, "2"])
def test_a_tier_refusing_the_run_during_collection_is_one_usage_error(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: str | None) -> None:
    """A tier registered while collection runs may refuse the run in its configure (a bad
    SHAREDKV_INJECT_TARGETS): the usage error comes once the items are known, before any
    test, not as one module's collection error."""
    monkeypatch.setenv("SHAREDKV_INJECT_TARGETS", "not-a-target")
    pytester.makepyfile("import pytest\n\n@pytest.mark.replica_pair\ndef test_x():\n    pass\n")
    if workers:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", workers)
    else:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["ERROR: SHAREDKV_INJECT_TARGETS=not-a-target: *"])
    out = result.stdout.str() + result.stderr.str()
    assert "ERROR collecting" not in out and "INTERNALERROR" not in out
    assert "passed" not in out
