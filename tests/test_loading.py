"""The plugin loads through its entry point or ``-p``, once, and never imports torch."""

from __future__ import annotations

from collections.abc import Callable

import pytest

NO_HEAVY = """
import sys

def test_no_heavy_imports():
    heavy = sorted(m for m in ("torch", "lmcache", "vllm") if m in sys.modules)
    assert heavy == [], heavy

def test_plugin_loaded(pytestconfig):
    assert pytestconfig.pluginmanager.get_plugin("sharedkv") is not None
"""


def test_entry_point_load_imports_no_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(NO_HEAVY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sharedkv-trials=3")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["sharedkv: torch *", "sharedkv: GPUs: *"])


def test_dash_p_without_autoload(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
                                 ) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(NO_HEAVY)
    result = pytester.runpytest_subprocess("-p", "pytest_sharedkv")
    result.assert_outcomes(passed=2)


def test_dash_p_with_autoload_registers_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(NO_HEAVY)
    result = pytester.runpytest_subprocess("-p", "pytest_sharedkv")
    result.assert_outcomes(passed=2)
    assert "already registered" not in result.stderr.str()


def test_disabled_with_no_sharedkv(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(pytestconfig):\n"
                        "    assert pytestconfig.pluginmanager.get_plugin('sharedkv') is None\n")
    result = pytester.runpytest_subprocess("-p", "no:sharedkv")
    result.assert_outcomes(passed=1)
    assert "sharedkv:" not in result.stdout.str()


def test_works_without_xdist(pytester: pytest.Pytester, fake_gpus: Callable[[str], None]) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.sharedkv_gpu
        def test_gpu(sharedkv_gpu_lease):
            assert sharedkv_gpu_lease.tokens
    """)
    fake_gpus("0")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_collecting_the_suite_imports_no_torch(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import sys

        def pytest_collection_finish(session):
            heavy = sorted(m for m in ("torch", "lmcache", "vllm") if m in sys.modules)
            print("HEAVY-MODULES:", heavy)
    """)
    result = pytester.runpytest_subprocess("--pyargs", "pytest_sharedkv.suites", "--collect-only",
                                           "-q", "-s", "-p", "no:cacheprovider")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["HEAVY-MODULES: []"])


def test_registering_the_tiers_scans_no_entry_points(pytester: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiers' modules come by module name: no look-up of each among every installed
    distribution's entry points (what ``pytest_plugins`` costs)."""
    from pytest_sharedkv import plugin

    config = pytester.parseconfig("-p", "no:cacheprovider")
    manager = config.pluginmanager
    scans: list[tuple[object, ...]] = []

    def scan(*args: object, **kwargs: object) -> int:
        scans.append(args)
        return 0

    monkeypatch.setattr(manager, "load_setuptools_entrypoints", scan)
    assert all(manager.get_plugin(name) is None for name in plugin.TIER_PLUGINS)
    plugin.load_tiers(config)
    assert scans == []
    assert not hasattr(plugin, "pytest_plugins")
    assert all(manager.get_plugin(name) is not None for name in plugin.TIER_PLUGINS)


# pytest's and xdist's private attributes the plugin once reached for; the public way is
# item.fixturenames and xdist's workerinput / report attributes.
PRIVATE = ("_fixtureinfo", "name2fixturedefs", "gateway._io", "._rinfo", "_fixturemanager")


def test_the_plugin_reaches_no_private_pytest_or_xdist_attribute() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "pytest_sharedkv"
    found = [f"{path.relative_to(root)}: {name}"
             for path in (root / "plugin.py", root / "config" / "tiers.py",
                          root / "processes" / "xdist_workers.py")
             for name in PRIVATE if name in path.read_text()]
    assert found == []


def test_a_plugin_fixture_reached_through_a_users_fixture_makes_a_sharedkv_test(
        pytester: pytest.Pytester) -> None:
    """The test's fixture closure (item.fixturenames) names the plugin's fixture: the run
    is active, and the header says so."""
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef sink(sharedkv_results):\n"
                          "    return sharedkv_results\n")
    pytester.makepyfile("def test_x(sink):\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["sharedkv: GPUs: *"])


UNCONFIGURE_WATCH = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    print("COLLECTOR AFTER UNCONFIGURE:", config.pluginmanager.get_plugin("sharedkv-collector"))
"""


def test_the_collector_goes_at_unconfigure(pytester: pytest.Pytester) -> None:
    """What the plugin registers for a run does not outlive it (a pytest.main() caller's
    plugin manager, an in-process inner run)."""
    pytester.makeconftest(UNCONFIGURE_WATCH)
    pytester.makepyfile("import pytest\n\n@pytest.mark.ordering\ndef test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("-s", "-p", "no:cacheprovider", "--sharedkv-trials=3")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["COLLECTOR AFTER UNCONFIGURE: None"])
