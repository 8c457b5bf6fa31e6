"""identity tier: everything that changes KV partitions the key (issue 50).

For each stack and each dimension (salt, LoRA adapter, weights under one served name, RoPE
scaling, kv-cache dtype, chunk size, LMCache release, a restart with a persistent L2), a
pair of cells: the same identity must hit (the positive control: otherwise VOID) and
another identity must not hit, or must answer exactly. A hit across identities that
answered wrong fails naming the dimension; a hit across tenants (cache_salt) fails as an
isolation breach, whatever the answers. A dimension a stack cannot vary here is skipped
with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_sharedkv.identity.cells import Inputs
    from pytest_sharedkv.identity.table import IdentityCell
    from pytest_sharedkv.report.records import ResultSink


@pytest.mark.identity
def test_identity_pair(sharedkv_identity_cell: IdentityCell,
                       sharedkv_identity_inputs: Inputs,
                       sharedkv_results: ResultSink, request: pytest.FixtureRequest) -> None:
    from pytest_sharedkv.config.markers import skip_not_asked
    from pytest_sharedkv.identity.cells import run_cell

    outcome = run_cell(sharedkv_identity_cell, sharedkv_identity_inputs, sharedkv_results)
    if outcome.skip:
        skip_not_asked(request.node, outcome.skip)  # not hardware: stays a skip
    if outcome.failures:
        pytest.fail("; ".join(outcome.failures), pytrace=False)
    if outcome.void:  # proves nothing: never a pass
        pytest.fail("; ".join(outcome.void), pytrace=False)
