"""Which tests are sharedkv tests, and of which tier: the plugin's markers and its shipped
suite decide, never a folder, file or keyword name.

A downstream ``tests/perf/`` folder or a user's fixture called ``packed_case`` must not
make the plugin count, parametrize or announce anything. The tier is read from the item's
markers when its reports are made and carried on the report (``report_fields``), so the
controller never guesses from keywords.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

from pytest_sharedkv.config.markers import GPU_MARKER, REQUIRES_MARKER, TIER_MARKERS

SUITE_PACKAGE = "pytest_sharedkv.suites"
FIXTURE_PREFIX = "sharedkv_"
SHAREDKV_MARKERS = frozenset((*TIER_MARKERS, GPU_MARKER, REQUIRES_MARKER))


def tier_of(item: pytest.Item) -> str | None:
    """The closest tier marker on the item."""
    for mark in item.iter_markers():
        if mark.name in TIER_MARKERS:
            return mark.name
    return None


@cache
def suite_dir() -> Path | None:
    """Where the shipped suite lives (site-packages, or suites/ of an editable checkout)."""
    spec = importlib.util.find_spec(SUITE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


@cache
def in_shipped_suite(path: Path) -> bool:
    """Whether PATH is in the shipped suite (kept per path: a collection asks once per
    module, not once per test)."""
    root = suite_dir()
    return root is not None and root in path.resolve().parents


def is_sharedkv_item(item: pytest.Item) -> bool:
    """A tier marker, a sharedkv need (GPU, packages), a test of the shipped suite, or a
    test that uses one of the plugin's fixtures."""
    if uses_plugin_fixture(item) or tier_of(item) is not None:
        return True
    if item.get_closest_marker(GPU_MARKER) or item.get_closest_marker(REQUIRES_MARKER):
        return True
    return in_shipped_suite(item.path)


def uses_plugin_fixture(item: pytest.Item) -> bool:
    """The test's fixtures (the whole closure, ``Function.fixturenames``) include one of the
    plugin's, which are all ``sharedkv_``-prefixed; an item that has no fixtures (a
    doctest, another plugin's item) uses none."""
    names = getattr(item, "fixturenames", ())
    return any(name.startswith(FIXTURE_PREFIX) for name in names)


def is_sharedkv_mark(mark: pytest.Mark) -> bool:
    """A tier or need marker, or ``usefixtures`` naming one of the plugin's fixtures."""
    if mark.name in SHAREDKV_MARKERS:
        return True
    return mark.name == "usefixtures" and any(
        str(name).startswith(FIXTURE_PREFIX) for name in mark.args)


def parametrizes(metafunc: pytest.Metafunc, fixture: str, tier: str) -> bool:
    """Whether a tier's ``pytest_generate_tests`` may parametrize FIXTURE for this function.

    Only the plugin's own (``sharedkv_``-prefixed) fixtures, and only for functions of that
    tier: marked with the tier marker, or defined in the shipped suite. A user's fixture of
    the same short name, or an unmarked test, is left alone.
    """
    if not fixture.startswith(FIXTURE_PREFIX):
        raise ValueError(f"plugin fixtures are named {FIXTURE_PREFIX}*, not {fixture!r}")
    if fixture not in metafunc.fixturenames:
        return False
    definition = metafunc.definition
    return definition.get_closest_marker(tier) is not None or in_shipped_suite(definition.path)


def suite_tiers() -> set[str]:
    """The tiers the shipped suite has tests for, read from its source (nothing imported)."""
    root = suite_dir()
    found: set[str] = set()
    for path in root.glob("test_*.py") if root is not None else ():
        found.update(re.findall(r"\bmark\.(\w+)", path.read_text(errors="replace")))
    return found & set(TIER_MARKERS)


def unselected_tier_lines(markexpr: str) -> list[str]:
    """For a -m expression that selected nothing: which tiers it names have no tests yet."""
    named = [t for t in TIER_MARKERS if re.search(rf"\b{t}\b", markexpr)]
    if not named:
        return []
    shipped = suite_tiers()
    missing = [t for t in named if t not in shipped]
    if not missing:
        return []
    which = " and ".join(missing)
    return [f"sharedkv: -m {markexpr!r} selected no test: the {which} "
            f"tier{'s have' if len(missing) > 1 else ' has'} no tests yet (this version's "
            f"suite has tests for {', '.join(t for t in TIER_MARKERS if t in shipped)})"]
