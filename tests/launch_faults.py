"""Faults planted in the suite's test doubles for an inner run, through the plugin's
``pytest_sharedkv_launch_faults`` hook: a plugin object for an in-process run
(``runpytest(..., plugins=[Planted(...)])``), a conftest.py for a subprocess one."""

from __future__ import annotations

import pytest

from pytest_sharedkv.stack.faults import LaunchFaults, StubFaults, TransferFaults

__all__ = ["LaunchFaults", "Planted", "StubFaults", "TransferFaults", "plant"]


class Planted:
    """A plugin that plants FAULTS in the run it is handed to."""

    def __init__(self, faults: LaunchFaults) -> None:
        self.faults = faults

    def pytest_sharedkv_launch_faults(self, config: pytest.Config) -> LaunchFaults:
        return self.faults


CONFTEST = """\
from pytest_sharedkv.stack.faults import LaunchFaults, StubFaults, TransferFaults


def pytest_sharedkv_launch_faults(config):
    return {faults!r}
"""


def plant(pytester: pytest.Pytester, faults: LaunchFaults | StubFaults | TransferFaults
          ) -> None:
    """A conftest.py in the inner run's directory that plants FAULTS (a stub's or the
    transfer provider's alone: the other plants none)."""
    if isinstance(faults, StubFaults):
        faults = LaunchFaults(stub=faults)
    elif isinstance(faults, TransferFaults):
        faults = LaunchFaults(transfer=faults)
    pytester.makeconftest(CONFTEST.format(faults=faults))
