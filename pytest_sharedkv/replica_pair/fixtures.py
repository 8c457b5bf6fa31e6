"""The replica_pair tier's pytest side: the model-free transfer check's matrix and the
tier's summary. The pair it sends through comes from ``stack.fixtures``; the matrix
parametrizes only this tier's tests (``tiers.parametrizes``), so a project's own
``transfer_case`` fixture is never touched."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.config.tiers import parametrizes
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.report.terminal import TierReport
    from pytest_sharedkv.stack.faults import TransferFaults

TRANSFER = "sharedkv_transfer_case"


def transfer_cases(settings: Settings, faults: TransferFaults | None = None) -> list[Any]:
    """The transfer provider's matrix: the CPU server (CI; LMCache turns lazy L1 off
    without CUDA, so mixed only, and no delay: the hook delays GPU streams), then on a
    leased GPU every allocator, undelayed and, in fault-sensitivity mode, delayed. FAULTS:
    what a self-test planted in every cell."""
    from pytest_sharedkv.stack.checks.transfer_provider import TransferCase
    from pytest_sharedkv.stack.faults import TransferFaults

    planted = faults if faults is not None else TransferFaults()
    cases = [TransferCase("cpu", "mixed", 0, planted)]
    cases += [TransferCase("cuda", a, d, planted) for a in settings.allocators
              for d in settings.delays]
    return [pytest.param(c, id=c.id, marks=[pytest.mark.sharedkv_gpu] if c.device == "cuda"
                         else []) for c in cases]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if parametrizes(metafunc, TRANSFER, "replica_pair"):
        from pytest_sharedkv.stack.faults import planted

        metafunc.parametrize(TRANSFER, transfer_cases(state_of(metafunc.config).settings,
                                                      planted(metafunc.config).transfer))


def pytest_sharedkv_tier_report() -> TierReport:
    """The replica_pair tier's part of the terminal summary."""
    from pytest_sharedkv.replica_pair import summary
    from pytest_sharedkv.report.terminal import TierReport

    return TierReport("replica_pair", lines=summary.summary_lines)
