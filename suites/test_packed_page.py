"""packed_page tier: every byte of every KV layout survives a cross-replica round trip.

For each (layout, LMCache path, device): replica A's paged KV (built at vLLM's exact
shapes and strides, position-coded) is stored through LMCache's own transfer code and
retrieved into replica B at other block ids. Every moved page must match byte for byte
(attention pages and the recurrent GDN state pages alike) and every other page of B must
be untouched. Combinations LMCache refuses by design are xfails with LMCache's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # torch stays out of collection
    from pytest_sharedkv.packed_page.fixtures import PackedCase, PackedPageRunner
    from pytest_sharedkv.report.records import ResultSink
@pytest.mark.packed_page
@pytest.mark.sharedkv_requires("torch", "lmcache")
def test_every_byte_survives_the_round_trip(
    sharedkv_packed_case: PackedCase, sharedkv_packed_page: PackedPageRunner,
    sharedkv_results: ResultSink,
) -> None:
    verdict = sharedkv_packed_page.run(sharedkv_packed_case, sharedkv_results)
    if verdict.skip:
        pytest.skip(verdict.message)
    if verdict.xfail:
        pytest.xfail(verdict.message)
    if not verdict.ok:
        pytest.fail(verdict.message, pytrace=False)
