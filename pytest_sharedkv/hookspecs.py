"""Hooks other plugins implement to extend the tiers (pytest's ``pytest_addhooks``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_sharedkv.layouts.specs import LayoutRegistry
    from pytest_sharedkv.ordering.targets import TargetRegistry
    from pytest_sharedkv.report.terminal import TierReport
    from pytest_sharedkv.stack.faults import LaunchFaults


@pytest.hookspec
def pytest_sharedkv_copy_targets(registry: TargetRegistry) -> None:
    """Add copy paths to the ordering tier: ``registry.add(CopyTarget(...))``.

    Other KV stacks (Mooncake, NIXL, vLLM's native offload) register the host<->device
    copies they perform, with a role ("under-test" for the stack's own paths) and a
    factory ``"package.module:function"`` that is imported only when a test runs. The
    factory gets the probe backend and returns a ``CopyImpl``.
    """


@pytest.hookspec
def pytest_sharedkv_layouts(registry: LayoutRegistry) -> None:
    """Add engine KV layouts to the packed_page tier: ``registry.add(LayoutSpec(...))``.

    A layout is plain geometry (family, backend, generation, heads, head size, dtype, block
    sizes, layer count); the tier builds the engine's tensors from it and round-trips them
    through LMCache.
    """


@pytest.hookspec
def pytest_sharedkv_tier_report(config: pytest.Config) -> TierReport | None:
    """A tier's part of the terminal summary: ``TierReport(tier, table, own_table, lines)``
    (an implementation may take ``config``, or no argument).

    Every tier's pytest module implements it (the report layer imports no tier); a plugin
    that adds a tier of its own under a marker returns one for it.
    """


@pytest.hookspec(firstresult=True)
def pytest_sharedkv_launch_faults(config: pytest.Config) -> LaunchFaults | None:
    """For the suite's own self-tests: the faults to plant in its test doubles (the stub
    replicas, the transfer provider's fetching replica), as ``LaunchFaults``; None: none.

    A self-test hands in a plugin implementing it (``plugins=[...]`` of an in-process
    run, or the inner run's conftest.py); a real run has no implementation.
    """
