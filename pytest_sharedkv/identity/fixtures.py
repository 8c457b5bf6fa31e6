"""The identity tier's pytest side: its table parametrizes only this tier's tests
(``tiers.parametrizes``), one test a (stack, dimension) pair; the real server's cells
share one run of the drivers for the session (started on first use); the tier's summary.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.tiers import parametrizes
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.identity.cells import Inputs
    from pytest_sharedkv.report.terminal import TierReport
    from pytest_sharedkv.stack.checks.identity_transfer import Observed

CELL = "sharedkv_identity_cell"


def identity_params() -> list[Any]:
    """The CPU stacks' pairs (the stub, the real server); the GPU stacks' table is in
    the summary and the GPU kit's plan."""
    from pytest_sharedkv.identity.table import IdentityStack, cells

    params = []
    for cell in cells((IdentityStack.STUB, IdentityStack.TRANSFER)):
        marks = ([pytest.mark.sharedkv_requires("lmcache")]
                 if cell.stack is IdentityStack.TRANSFER and cell.reach.runs else [])
        params.append(pytest.param(cell, id=cell.id, marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if parametrizes(metafunc, CELL, "identity"):
        metafunc.parametrize(CELL, identity_params())


def _salt(config: pytest.Config) -> str:
    given = state_of(config).settings.identity_salt
    return given if given is not None else f"sharedkv-identity-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def sharedkv_identity_transfer(tmp_path_factory: pytest.TempPathFactory,
                               pytestconfig: pytest.Config) -> Callable[[], Observed]:
    """The real server's identity run (salt, chunk size, restart), once for the session
    and only when a cell asks: a callable, so a run of the stub's cells starts nothing."""
    from pytest_sharedkv.stack.faults import planted

    found: list[Observed] = []

    def observed() -> Observed:
        if not found:
            from pytest_sharedkv.stack.checks.identity_transfer import run_identity

            salt = _salt(pytestconfig)
            blind = planted(pytestconfig).transfer.salt_blind
            found.append(run_identity(tmp_path_factory.mktemp("identity-transfer"), salt,
                                      f"{salt[:100]}-tenant-2", salt_blind=blind))
        return found[0]

    return observed


@pytest.fixture
def sharedkv_identity_inputs(request: pytest.FixtureRequest, tmp_path: Path,
                             sharedkv_identity_transfer: Callable[[], Observed]) -> Inputs:
    from pytest_sharedkv.identity.cells import Inputs
    from pytest_sharedkv.stack.faults import planted

    config = request.config
    return Inputs(log_dir=tmp_path, salt=_salt(config), faults=planted(config),
                  transfer=sharedkv_identity_transfer,
                  release_site=state_of(config).settings.identity_release_site)


def pytest_sharedkv_tier_report() -> TierReport:
    """The identity tier's part of the terminal summary: its table and VERDICT line."""
    from pytest_sharedkv.identity import summary
    from pytest_sharedkv.report.terminal import TableSpec, TierReport

    return TierReport("identity", table=TableSpec(rows=("stack", "dimension", "direction"),
                                                  column="side"),
                      lines=summary.summary_lines)
