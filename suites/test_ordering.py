"""Ordering tier: does each KV copy path honour the current CUDA stream?

``pytest -m ordering`` runs one test per (copy target, direction, size); each runs its
trials with and without the imposed delay and fails with byte-level evidence (mismatching
bytes, first offset, expected and observed values) when a path is not stream-ordered.
Targets: ``--sharedkv-list-targets``. The negative control's test fails when the probe
cannot see an ordering fault, and then every other result is void.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # torch stays out of collection: the session module imports it
    from pytest_sharedkv.ordering.cells import Cell
    from pytest_sharedkv.ordering.session import OrderingSession
    from pytest_sharedkv.report.records import ResultSink
@pytest.mark.ordering
@pytest.mark.sharedkv_gpu
@pytest.mark.sharedkv_requires("torch")
def test_copy_path_is_stream_ordered(
    sharedkv_ordering_cell: Cell, sharedkv_ordering_session: OrderingSession,
    sharedkv_results: ResultSink,
) -> None:
    judgement = sharedkv_ordering_session.judge(sharedkv_ordering_cell, sharedkv_results)
    if not judgement.ok and judgement.expected:  # a reference (fallback LMCache does not run)
        pytest.xfail(f"{judgement.expected}: {judgement.message}")
    if not judgement.ok:
        pytest.fail(judgement.message, pytrace=False)
