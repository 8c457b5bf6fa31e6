"""The ordering tier's pytest side: the target registry, the matrix, the session fixture.

Registered by the main plugin. Imports nothing heavy at module level: torch (and lmcache,
for its targets) are imported by the session fixture, after the GPU lease has set
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.cuda_check import cuda_unavailable_reason
from pytest_sharedkv.options import Settings
from pytest_sharedkv.ordering.cells import Cell
from pytest_sharedkv.ordering.child_session import launch_blocking
from pytest_sharedkv.ordering.targets import DIRECTIONS, TargetRegistry, builtin_registry
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.ordering.child_session import ChildSession
    from pytest_sharedkv.ordering.session import OrderingSession

REGISTRY = pytest.StashKey[TargetRegistry]()
SIMULATED_ENV = "SHAREDKV_SIMULATED_STREAMS"  # the self-tests' seam; see simulated.py


def active_backend() -> str:
    return "simulated" if os.environ.get(SIMULATED_ENV) else "cuda"


def build_registry(config: pytest.Config, settings: Settings) -> TargetRegistry:
    registry = builtin_registry()
    config.hook.pytest_sharedkv_copy_targets(registry=registry)
    if settings.targets is not None:
        known = [t.name for t in registry.for_backend(active_backend())]
        unknown = [name for name in settings.targets if name not in known]
        if unknown:
            raise pytest.UsageError(
                f"{settings.sources.get('targets', '--sharedkv-targets')}: unknown copy "
                f"target(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
    return registry


def pytest_configure(config: pytest.Config) -> None:
    # Runs after the main plugin's (tryfirst) pytest_configure has validated the settings.
    config.stash[REGISTRY] = build_registry(config, state_of(config).settings)


def selected_cells(registry: TargetRegistry, settings: Settings) -> list[tuple[Cell, Any]]:
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
    if "ordering_cell" not in metafunc.fixturenames:
        return
    config = metafunc.config
    settings = state_of(config).settings
    cells = selected_cells(config.stash[REGISTRY], settings)
    metafunc.parametrize(
        "ordering_cell",
        [pytest.param(cell, marks=marks, id=cell.id) for cell, marks in cells],
        indirect=True,
    )


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if not config.getoption("sharedkv_list_targets", default=None):
        return None
    config._do_configure()
    try:
        for line in list_targets(config.stash[REGISTRY]):
            print(line)
    finally:
        config._ensure_unconfigure()
    return 0


@pytest.fixture
def ordering_cell(request: pytest.FixtureRequest) -> Cell:
    """One (target, direction, size) cell of the ordering matrix."""
    cell: Cell = request.param
    return cell


def _require_cuda() -> None:
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
def ordering_session(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[OrderingSession | ChildSession]:
    """The process's probe: backend, buffers per size, copy paths, sensitivity gate (in a
    child process when CUDA_LAUNCH_BLOCKING would make every launch synchronous here)."""
    settings = state_of(pytestconfig).settings
    registry = pytestconfig.stash[REGISTRY]
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
        from pytest_sharedkv.environment import dist_version

        if dist_version("lmcache") is not None:
            from pytest_sharedkv.lmcache_status import probe

            session.pending_facts.append(("lmcache in the test process", probe().describe()))
    try:
        yield session
    finally:
        session.close()
