"""The run's state, kept in ``config.stash`` (never in module globals)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pytest_sharedkv.gating import Gate
from pytest_sharedkv.options import Settings
from pytest_sharedkv.run_log import RunLog


@dataclass
class RunState:
    settings: Settings
    is_worker: bool
    log: RunLog = field(default_factory=RunLog)
    gate: Gate | None = None
    header: list[str] | None = None
    json_written: str | None = None


STATE = pytest.StashKey[RunState]()


def state_of(config: pytest.Config) -> RunState:
    return config.stash[STATE]
