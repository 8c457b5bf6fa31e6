"""Whether ``--dist loadgroup`` grouped this run's pair tests, as the suite relies on.

Each replica pair's tests carry an ``xdist_group`` so one worker starts the pair and runs
its pass once. xdist groups by a ``@group`` suffix it writes into each item's node id on
the worker; pytest 9.2 keeps node ids in a structured field that suffix no longer reaches
(pytest-dev/pytest-xdist#1386, open), so the tests are spread as if unmarked and each
worker starts its own pair and pass: correct, but more engines and more time. The worker
sees it (its items carry the mark, their ids no suffix) and the run says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

LOST = "sharedkv_loadgroup_lost"  # workeroutput: this worker saw the grouping lost
MARK = "xdist_group"
FACT = "xdist grouping"  # the JSON report's fact, where the grouping was lost


def grouping_lost(config: pytest.Config, items: Sequence[pytest.Item]) -> bool:
    """On a worker of a ``--dist loadgroup`` run: an item marked ``xdist_group`` whose node
    id has no ``@`` suffix (xdist writes it before this runs: trylast)."""
    if not getattr(config.option, "loadgroup", False):
        return False
    marked = [item for item in items if item.get_closest_marker(MARK) is not None]
    return bool(marked) and not any("@" in item.nodeid for item in marked)


def note(pytest_version: str, xdist_version: str) -> str:
    return (f"NOTE xdist: --dist loadgroup did not group the pair tests (pytest "
            f"{pytest_version}, pytest-xdist {xdist_version}: the group suffix no longer "
            "reaches pytest's node ids, pytest-dev/pytest-xdist#1386), so each worker "
            "starts its own replica pair and pass for the pair tests it gets")
