"""``--dist loadgroup`` keeps each replica pair's tests on one worker; where xdist's group
suffix does not reach the node ids (pytest 9.2 with pytest-xdist 3.8:
pytest-dev/pytest-xdist#1386) the run must say so, in the summary and the JSON report,
rather than start a pair per worker silently. The detector is held to both answers; the
inner run holds the whole path to whatever this environment's xdist does."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_sharedkv.config.xdist_groups import FACT, grouping_lost

GROUPED = """
import pytest

@pytest.mark.replica_pair
@pytest.mark.xdist_group("sharedkv-pair-x")
@pytest.mark.parametrize("i", range(4))
def test_pair(i):
    pass
"""


class _Item:
    def __init__(self, nodeid: str, marked: bool) -> None:
        self.nodeid = nodeid
        self.marked = marked

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.marked and name == "xdist_group" else None


def _config(loadgroup: bool) -> Any:
    return SimpleNamespace(option=SimpleNamespace(loadgroup=loadgroup))


def test_the_detector_tells_a_lost_grouping_from_a_kept_one() -> None:
    kept: Any = [_Item("t.py::test_pair[0]@g", True), _Item("t.py::test_other", False)]
    lost: Any = [_Item("t.py::test_pair[0]", True), _Item("t.py::test_other", False)]
    assert not grouping_lost(_config(True), kept)
    assert grouping_lost(_config(True), lost)
    assert not grouping_lost(_config(False), lost)  # not a loadgroup run
    assert not grouping_lost(_config(True), lost[1:])  # nothing marked


def test_a_loadgroup_run_says_whether_its_pairs_were_grouped(pytester: pytest.Pytester
                                                             ) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_grouped=GROUPED)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-v",
                                           "-p", "no:cacheprovider", "--sharedkv-json=r.json")
    result.assert_outcomes(passed=4)
    grouped = any("@sharedkv-pair-x" in line for line in result.outlines)
    facts = {f["name"]: f["value"] for f in
             json.loads((pytester.path / "r.json").read_text())["facts"]}
    said = [line for line in result.outlines if line.startswith("NOTE xdist: --dist loadgroup")]
    if grouped:  # xdist's suffix reached the ids: nothing to say
        assert not said and FACT not in facts
    else:
        assert len(said) == 1 and "pytest-dev/pytest-xdist#1386" in said[0]
        assert facts[FACT] == said[0]
