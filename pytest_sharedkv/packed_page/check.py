"""The byte checker: every moved page must equal its source; every other page must not move.

A mismatch names the kernel group, layer, source and destination block, the token, head
and byte inside the page (or the recurrent-state region), how many bytes differ, and the
expected and observed values. Pages are compared at raw-pool granularity, so whatever
view a transfer used, the bytes are judged where the engine will read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pytest_sharedkv.layouts.build import Pool

MAX_REPORTED = 8


@dataclass(frozen=True)
class PageMismatch:
    pool: int
    group: int
    layer: str
    block_a: int | None  # None: a page that must not have changed
    block_b: int
    count: int
    page_bytes: int
    first_offset: int
    where: str
    expected: int
    observed: int

    def describe(self) -> str:
        move = (f"block {self.block_a} -> {self.block_b}" if self.block_a is not None
                else f"block {self.block_b} (must not change)")
        return (f"kernel group {self.group}, layer {self.layer}, {move}: {self.count} of "
                f"{self.page_bytes} bytes differ, first at {self.where} (page byte "
                f"{self.first_offset}): expected 0x{self.expected:02x}, observed "
                f"0x{self.observed:02x}")


@dataclass
class CheckResult:
    moved_pages: int = 0
    untouched_pages: int = 0
    bytes_compared: int = 0
    mismatched_pages: int = 0
    mismatches: list[PageMismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.mismatched_pages == 0

    def describe(self) -> str:
        if self.ok:
            return (f"{self.moved_pages} moved and {self.untouched_pages} untouched pages "
                    f"byte-identical ({self.bytes_compared} bytes compared)")
        first = self.mismatches[0].describe()
        return f"{self.mismatched_pages} page(s) wrong; first: {first}"


def _pages(raw: torch.Tensor, page: int) -> torch.Tensor:
    flat = raw.view(torch.uint8).view(-1)
    return flat[: (flat.numel() // page) * page].view(-1, page)


def _owner(pool: Pool, block: int) -> tuple[int, str]:
    base = block % pool.plane_blocks if pool.plane_blocks else block
    return pool.owner(base)


def _mismatch(pool_index: int, pool: Pool, block_a: int | None, block_b: int,
              expected: torch.Tensor, observed: torch.Tensor) -> PageMismatch:
    diff = expected.ne(observed)
    first = int(diff.nonzero()[0, 0])
    group, layer = _owner(pool, block_b if block_a is None else block_a)
    page_map = pool.maps.get(group)
    where = page_map.locate(first) if page_map is not None else f"page byte {first}"
    return PageMismatch(pool=pool_index, group=group, layer=layer, block_a=block_a,
                        block_b=block_b, count=int(diff.count_nonzero()),
                        page_bytes=pool.page_bytes, first_offset=first, where=where,
                        expected=int(expected[first]), observed=int(observed[first]))


def check_round_trip(a_pools: Sequence[Pool], b_pools: Sequence[Pool],
                     b_before: Sequence[torch.Tensor],
                     moves: dict[int, list[tuple[int, int]]]) -> CheckResult:
    """moves[pool] = [(block in A, block in B)]: B's page must equal A's, byte for byte."""
    result = CheckResult()
    for index, (a, b, before) in enumerate(zip(a_pools, b_pools, b_before, strict=True)):
        page = b.page_bytes
        a_pages, b_pages, orig = _pages(a.raw, page), _pages(b.raw, page), _pages(before, page)
        pairs = moves.get(index, [])
        moved = {dst for _, dst in pairs}
        for src, dst in pairs:
            result.moved_pages += 1
            result.bytes_compared += page
            if not torch.equal(a_pages[src], b_pages[dst]):
                result.mismatched_pages += 1
                if len(result.mismatches) < MAX_REPORTED:
                    result.mismatches.append(
                        _mismatch(index, a, src, dst, a_pages[src], b_pages[dst]))
        changed = b_pages.ne(orig).any(dim=1).nonzero().flatten().tolist()
        untouched = b_pages.shape[0] - len(moved)
        result.untouched_pages += untouched
        result.bytes_compared += untouched * page
        for block in changed:
            if block in moved:
                continue
            result.mismatched_pages += 1
            if len(result.mismatches) < MAX_REPORTED:
                result.mismatches.append(
                    _mismatch(index, b, None, block, orig[block], b_pages[block]))
    return result
