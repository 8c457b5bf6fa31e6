"""The xdist workers of this run, as the controller knows them, so that a SIGTERM the
controller takes reaches them at once.

Without it a worker sleeping in a test hears of the end only through execnet: its
gateway waits 5 s for the test, then interrupts itself, and the controller's gateway
timeout (10 s) bounds the rest; a SIGTERM-ed controller took 12.3 s to exit on a 2-core
host. Passed on, the workers tear down as for Ctrl-C straight away (a worker that got the
signal itself ignores the second, see ``interrupts``).
"""

from __future__ import annotations

from typing import Any

import pytest

WORKERS = pytest.StashKey[set[int]]()


def _pid(node: Any) -> int | None:
    """The worker's pid: execnet's popen gateway keeps its ``subprocess.Popen`` at
    ``gateway._io.popen`` (not public API: a gateway without it is passed over, and that
    worker ends as xdist ends it)."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    pid = getattr(popen, "pid", None)
    return pid if isinstance(pid, int) else None


def remember(node: Any) -> None:
    pid = _pid(node)
    if pid is not None:
        node.config.stash.setdefault(WORKERS, set()).add(pid)


def forget(node: Any) -> None:
    node.config.stash.get(WORKERS, set()).discard(_pid(node))


def pids(config: pytest.Config) -> list[int]:
    """The workers alive as far as the controller knows (none outside an xdist controller)."""
    workers: set[int] = config.stash.get(WORKERS, set())
    return sorted(workers)
