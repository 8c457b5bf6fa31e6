"""The run's state, kept in ``config.stash`` (never in module globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # loading the plugin imports neither: they come with the first use
    from pytest_sharedkv.config.gating import Gate
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.host.lmcache_status import LMCacheStatus
    from pytest_sharedkv.processes.closed_stdout import GuardedStdout
    from pytest_sharedkv.report.run_log import RunLog
    from pytest_sharedkv.report.spool import Spool


# An xdist worker that must refuse the run says why under this workeroutput key; the
# controller (plugin.py's pytest_testnodedown, always registered) raises the usage error. A
# tier's own testnodedown would not do: the controller collects nothing, so it may never
# register the tiers.
WORKER_USAGE_ERROR = "sharedkv_usage_error"
# workerinput: the name of the run's directory a worker spools its records to
# (report/spool.py), from the controller (plugin.py's pytest_configure_node)
WORKER_RECORDS_RUN = "sharedkv_records_run"


# eq=False, repr=False: a run's state is compared by identity, and a dataclass compiles each
# generated method in every pytest start.
@dataclass(eq=False, repr=False)
class RunState:
    settings: Settings
    is_worker: bool
    # sharedkv is in use in this run: a --sharedkv-* option or ini value was given, or a
    # sharedkv item was collected. Until then the plugin runs, writes and prints nothing.
    active: bool = False
    gate: Gate | None = None
    header: list[str] | None = None
    lmcache: LMCacheStatus | str | None = None  # behind the header's LMCache line
    header_shown: bool = False
    json_written: str | None = None
    # sys.stdout as the terminal writer got it, where a closed stdout ends the run
    stdout_guard: GuardedStdout | None = None
    session_done: bool = False  # pytest_sessionfinish has begun
    # xdist: the run's directory workers spool their records to (report/spool.py), named
    # by the controller for its workers on this machine; on a worker, its spool once used
    records_run: str | None = None
    spool: Spool | None = None
    _log: RunLog | None = None

    @property
    def log(self) -> RunLog:
        if self._log is None:
            from pytest_sharedkv.report.run_log import RunLog
            self._log = RunLog()
        return self._log

    @property
    def has_log(self) -> bool:
        return self._log is not None


STATE = pytest.StashKey[RunState]()


def state_of(config: pytest.Config) -> RunState:
    return config.stash[STATE]
