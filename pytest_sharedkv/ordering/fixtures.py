"""The ordering tier's pytest side: the target registry, the matrix, the session fixture.

Registered by the main plugin, so loading it must cost a project without sharedkv tests
nothing: the target registry is built on first need, and torch (and lmcache, for its
targets) are imported by the session fixture, after the GPU lease has set
``CUDA_VISIBLE_DEVICES``. Fixtures are ``sharedkv_``-prefixed and the matrix parametrizes
only tests of this tier (``tiers.parametrizes``), never a user's ``ordering_cell``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.tiers import parametrizes
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.ordering.cells import Cell
    from pytest_sharedkv.ordering.child_session import ChildSession
    from pytest_sharedkv.ordering.session import OrderingSession
    from pytest_sharedkv.ordering.targets import TargetRegistry
    from pytest_sharedkv.report.terminal import TierReport

TIER = "ordering"
CELL_FIXTURE = "sharedkv_ordering_cell"
REGISTRY: pytest.StashKey[TargetRegistry] = pytest.StashKey()
SIMULATED_ENV = "SHAREDKV_SIMULATED_STREAMS"  # the self-tests' seam; see simulated.py


def active_backend() -> str:
    return "simulated" if os.environ.get(SIMULATED_ENV) else "cuda"


def build_registry(config: pytest.Config, settings: Settings) -> TargetRegistry:
    from pytest_sharedkv.ordering.targets import builtin_registry

    registry = builtin_registry()
    config.hook.pytest_sharedkv_copy_targets(registry=registry)
    if settings.targets is not None:
        known = [t.name for t in registry.for_backend(active_backend())]
        unknown = [name for name in settings.targets if name not in known]
        if unknown:
            raise pytest.UsageError(
                f"{settings.source_of('targets')}: unknown copy "
                f"target(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
    return registry


def registry_of(config: pytest.Config) -> TargetRegistry:
    """The copy targets, built (and the extension hook called) on first need."""
    if REGISTRY not in config.stash:
        config.stash[REGISTRY] = build_registry(config, state_of(config).settings)
    return config.stash[REGISTRY]


def pytest_configure(config: pytest.Config) -> None:
    # Runs after the main plugin's (tryfirst) pytest_configure has validated the settings;
    # a --sharedkv-targets naming an unknown target is a usage error before any test runs.
    if state_of(config).settings.targets is not None:
        registry_of(config)


def selected_cells(registry: TargetRegistry, settings: Settings) -> list[tuple[Cell, Any]]:
    from pytest_sharedkv.ordering.cells import Cell
    from pytest_sharedkv.ordering.targets import DIRECTIONS

    cells = []
    for target in registry.for_backend(active_backend()):
        if settings.targets is not None and target.name not in settings.targets:
            continue
        marks = [pytest.mark.sharedkv_requires(*target.requires)] if target.requires else []
        for direction in (d for d in DIRECTIONS if d in target.directions):
            for nbytes in settings.sizes:
                cells.append((Cell(target.name, direction, nbytes), marks))
    return cells


def list_targets(registry: TargetRegistry) -> list[str]:
    from pytest_sharedkv.ordering.targets import DIRECTIONS

    lines = ["copy targets of the ordering tier (--sharedkv-targets NAME,...):"]
    for target in registry:
        needs = f" [needs {', '.join(target.requires)}]" if target.requires else ""
        backend = "" if target.backend == "cuda" else f" [backend {target.backend}]"
        only = "" if set(target.directions) == set(DIRECTIONS) else \
            f" [{'/'.join(target.directions)} only]"
        lines.append(f"  {target.name:32} {target.role:17} {target.summary}{needs}{backend}"
                     f"{only}")
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not parametrizes(metafunc, CELL_FIXTURE, TIER):
        return
    config = metafunc.config
    settings = state_of(config).settings
    cells = selected_cells(registry_of(config), settings)
    metafunc.parametrize(
        CELL_FIXTURE,
        [pytest.param(cell, marks=marks, id=cell.id) for cell, marks in cells],
        indirect=True,
    )


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if not config.getoption("sharedkv_list_targets", default=None):
        return None
    config._do_configure()
    try:
        for line in list_targets(registry_of(config)):
            print(line)
    finally:
        config._ensure_unconfigure()
    return 0


@pytest.fixture
def sharedkv_ordering_cell(request: pytest.FixtureRequest) -> Cell:
    """One (target, direction, size) cell of the ordering matrix."""
    cell: Cell | None = getattr(request, "param", None)
    if cell is None:
        pytest.fail(f"{CELL_FIXTURE} is parametrized only for tests marked "
                    f"@pytest.mark.{TIER}", pytrace=False)
    return cell


def _require_cuda() -> None:
    from pytest_sharedkv.host.cuda_check import cuda_unavailable_reason
    reason = cuda_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def _cuda_backend() -> Any:
    _require_cuda()
    from pytest_sharedkv.ordering.cuda_backend import CudaBackend

    return CudaBackend()


def _simulated_backend() -> Any:
    from pytest_sharedkv.ordering.simulated import BLOCKING_VALUE, SimulatedBackend

    return SimulatedBackend(blocking_default_stream=os.environ[SIMULATED_ENV] == BLOCKING_VALUE)


@pytest.fixture(scope="session")
def sharedkv_ordering_session(pytestconfig: pytest.Config,
                              tmp_path_factory: pytest.TempPathFactory
                              ) -> Iterator[OrderingSession | ChildSession]:
    """The process's probe: backend, buffers per size, copy paths, sensitivity gate (in a
    child process when CUDA_LAUNCH_BLOCKING would make every launch synchronous here)."""
    from pytest_sharedkv.host.cuda_check import launch_blocking

    settings = state_of(pytestconfig).settings
    registry = registry_of(pytestconfig)
    simulated = active_backend() == "simulated"
    session: OrderingSession | ChildSession
    if launch_blocking():
        if not simulated:
            _require_cuda()
        from pytest_sharedkv.ordering.child_session import ChildSession

        log = tmp_path_factory.mktemp("ordering-child") / "child.log"
        session = ChildSession(registry, settings.trials, settings.delay_cycles, settings.sizes,
                               os.environ[SIMULATED_ENV] if simulated else None, log)
    else:
        from pytest_sharedkv.ordering.session import OrderingSession

        backend = _simulated_backend() if simulated else _cuda_backend()
        session = OrderingSession(backend, registry, settings)
    if not simulated:
        from pytest_sharedkv.host.environment import dist_version
        if dist_version("lmcache") is not None:
            from pytest_sharedkv.host.lmcache_status import probe
            session.pending_facts.append(("lmcache in the test process", probe().describe()))
    try:
        yield session
    finally:
        session.close()


def pytest_sharedkv_tier_report() -> TierReport:
    """The ordering tier's part of the terminal summary."""
    from pytest_sharedkv.ordering import summary
    from pytest_sharedkv.report.terminal import TableSpec, TierReport

    table = TableSpec(rows=("target", "role", "direction", "size"), column="delay",
                      column_label="delay=", numeric_columns=True)
    return TierReport("ordering", table=table, lines=summary.summary_lines)
