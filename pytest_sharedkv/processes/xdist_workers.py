"""The xdist workers of this run, as the controller knows them, so that a signal the
controller takes reaches them at once (``interrupts``): a worker sleeping in a test
otherwise hears of the end only through execnet's shutdown, which waits on the test.

Each worker puts its id (``PYTEST_XDIST_WORKER``) and pid on the reports of sharedkv
items (a report attribute, which xdist serialises, as the tier travels); the controller
keeps them from the first such report until xdist says the worker is down
(``pytest_testnodedown``, by ``workerinput["workerid"]``), so a pid the system may hand to
another process is never signalled. A worker that has sent no sharedkv report yet ends as
xdist ends it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

WORKERS = pytest.StashKey[dict[str, int]]()
REPORT_WORKER = "sharedkv_worker"  # the report attribute: [worker id, pid]


def mark(report: pytest.TestReport) -> None:
    """On a worker: say which worker (and pid) made REPORT."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        setattr(report, REPORT_WORKER, [worker, os.getpid()])


def remember(config: pytest.Config, report: pytest.TestReport) -> None:
    """On the controller: the worker REPORT came from, if it says."""
    said = getattr(report, REPORT_WORKER, None)
    if isinstance(said, (list, tuple)) and len(said) == 2 and isinstance(said[1], int):
        config.stash.setdefault(WORKERS, {})[str(said[0])] = said[1]


def forget(node: Any) -> None:
    """A worker xdist took down: its pid is no longer this run's."""
    config = getattr(node, "config", None)
    worker = getattr(node, "workerinput", {}).get("workerid")
    if config is not None:
        config.stash.get(WORKERS, {}).pop(worker, None)


def pids(config: pytest.Config) -> list[int]:
    """The workers alive as far as the controller knows (none outside an xdist controller)."""
    return sorted(config.stash.get(WORKERS, {}).values())


def known(config: pytest.Config) -> dict[str, int]:
    """The workers alive as far as the controller knows, by worker id."""
    workers: dict[str, int] = config.stash.get(WORKERS, {})
    return dict(workers)
