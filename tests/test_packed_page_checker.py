"""The packed_page checker must name the first wrong byte: fed deliberately wrong transfers
(an off-by-one block mapping; the rank-5 attention assumption applied to a packed hybrid
buffer), it reports kernel group, layer, block, token and the byte count."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("lmcache", reason="the checker is exercised on LMCache's own transfers")

import torch

from pytest_sharedkv.layouts.build import Replica, plain_replica
from pytest_sharedkv.layouts.specs import LayoutSpec, default_registry
from pytest_sharedkv.packed_page.check import check_round_trip
from pytest_sharedkv.packed_page.round_trip import (
    block_ids,
    hybrid_round_trip,
    plain_moves,
    plain_round_trip,
    plain_trip,
)

CPU = torch.device("cpu")
LAYOUTS = default_registry()


def test_off_by_one_block_mapping_is_named() -> None:
    spec = LAYOUTS.get("fa-nhd-bf16")
    a, b = plain_replica(spec, 11, CPU), plain_replica(spec, 22, CPU)
    before = [p.raw.clone() for p in b.pools]
    a_ids, b_ids = block_ids(spec.num_blocks, 6, 7)
    shifted = [(x + 1) % spec.num_blocks for x in b_ids]
    plain_trip(spec, "kernel-fallback", CPU, a, b, a_ids, shifted)  # LMCache, wrong ids
    result = check_round_trip(a.pools, b.pools, before, plain_moves(spec, a_ids, b_ids))
    assert not result.ok
    first = result.mismatches[0]
    assert (first.group, first.layer) == (0, "model.layers.0.self_attn.attn")
    assert (first.block_a, first.block_b) == (a_ids[0], b_ids[0])
    assert first.where == "k|v: token 0, head 0, byte 0"
    page = spec.page_bytes()
    assert page * 0.9 < first.count <= page  # position-coded: nearly every byte differs
    text = result.describe()
    assert f"block {a_ids[0]} -> {b_ids[0]}: {first.count} of {page} bytes differ" in text
    # the page written by mistake is caught too
    assert any(m.block_a is None and m.block_b == shifted[0] for m in result.mismatches)


NON_HYBRID = [s.name for s in LAYOUTS if s.family != "hybrid"]


def _as_compiled_binding(calls: list[tuple[object, ...]]) -> Any:
    """A stand-in for lmcache.cuda_ops' ``multi_layer_block_kv_transfer``: it type-checks
    its arguments as the pybind signature does (issue 19's GPU run: ``paged_buffer_ptrs_tensor:
    torch.Tensor, lmcache_objects_ptrs: Sequence[SupportsInt], block_ids: torch.Tensor,
    device, direction: SupportsInt, shape_desc: PageBufferShapeDesc, ...``), then moves the
    bytes through LMCache's torch kernel in its pointer mode, so the bytes check too."""
    from lmcache.v1.platform.torch_ops import multi_layer_block_kv_transfer as torch_kernel

    def binding(*args: object) -> None:
        paged, objects, ids, device, direction, desc, chunk, fmt, skip = args
        ok = (isinstance(paged, torch.Tensor) and paged.dtype == torch.int64
              and paged.ndim == 1 and isinstance(objects, list | tuple)
              and all(type(o) is int for o in objects) and 0 < len(objects) <= 4
              and isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
              and isinstance(device, torch.device) and paged.device == ids.device == device
              and type(desc).__name__ == "PageBufferShapeDesc"
              and all(isinstance(int(x), int) for x in (direction, chunk, fmt, skip)))  # type: ignore[call-overload]
        if not ok:
            raise TypeError("multi_layer_block_kv_transfer(): incompatible function arguments."
                            f" Invoked with: {[type(a).__name__ for a in args]}")
        calls.append(args)
        torch_kernel(*args)

    return binding


@pytest.mark.parametrize("layout", NON_HYBRID)
def test_kernel_native_calls_the_compiled_binding_as_lmcache_does(
        layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: 7 kernel-native-cuda cells failed with the binding's TypeError because
    plain_trip passed tensor lists and a list of block ids (the torch fallback takes those)."""
    import lmcache

    from pytest_sharedkv.host.lmcache_status import device_ops

    calls: list[tuple[object, ...]] = []
    # bind_native's way: an instance attribute that shadows the class's torch fallback
    monkeypatch.setattr(device_ops(lmcache), "multi_layer_block_kv_transfer",
                        _as_compiled_binding(calls), raising=False)
    trip = plain_round_trip(LAYOUTS.get(layout), "kernel-native", CPU)
    assert trip.check.ok, trip.check.describe()
    assert len(calls) == 2  # one store, one retrieve (3 objects: one call each)
    assert [len(c[1]) for c in calls] == [3, 3]  # type: ignore[arg-type]


def test_identity_transfer_passes() -> None:
    spec = LAYOUTS.get("fa-nhd-bf16")
    a, b = plain_replica(spec, 11, CPU), plain_replica(spec, 22, CPU)
    before = [p.raw.clone() for p in b.pools]
    a_ids, b_ids = block_ids(spec.num_blocks, 6, 7)
    plain_trip(spec, "kernel-fallback", CPU, a, b, a_ids, b_ids)
    result = check_round_trip(a.pools, b.pools, before, plain_moves(spec, a_ids, b_ids))
    assert result.ok, result.describe()
    assert result.moved_pages == 6 * spec.num_layers


def _rank5_assumption(spec: LayoutSpec):  # type: ignore[no-untyped-def]
    """A transfer that takes each block to be one rank-5 attention page of the kernel block
    size (the assumption that broke in the field), and gets the GDN pages right."""
    kernel_page = spec.kernel_block_size() * spec.attn_bytes_per_token()
    page = spec.page_bytes()

    def mutate(a: Replica, b: Replica, ids_a: list[list[int]], ids_b: list[list[int]]) -> None:
        attention_group = len(ids_a) - 1  # GDN groups come first (first-layer order)
        for pool_a, pool_b in zip(a.pools, b.pools, strict=True):
            src = pool_a.raw.view(torch.uint8)
            dst = pool_b.raw.view(torch.uint8)
            # attention first, so the GDN pages written after it are intact
            order = [attention_group, *range(attention_group)]
            for g in order:
                from_ids, to_ids = ids_a[g], ids_b[g]
                step = kernel_page if g == attention_group else page
                for x, y in zip(from_ids, to_ids, strict=True):
                    if g != attention_group and from_ids.index(x) % 2 == 0:
                        continue  # GDN: only the last block of each chunk moves
                    dst[y * step:(y + 1) * step] = src[x * step:(x + 1) * step]

    return mutate


def test_rank5_view_of_a_packed_hybrid_page_is_named() -> None:
    spec = LAYOUTS.get("gdn-hybrid-flashinfer")
    assert spec.logical_block_size() // spec.kernel_block_size() == 5
    trip = hybrid_round_trip(spec, "server", CPU, mutate=_rank5_assumption(spec))
    result = trip.check
    assert not result.ok
    attention = [m for m in result.mismatches if m.block_a is not None]
    first = attention[0]
    assert first.group == 3
    assert first.layer == "model.layers.3.self_attn.attn"
    assert first.where.startswith("k|v: token ")
    assert 0 < first.count <= spec.page_bytes()
    # every GDN page that had to move is right: the checker blames only attention
    assert all(m.group == 3 for m in attention)


def test_gdn_page_region_is_named() -> None:
    spec = LAYOUTS.get("gdn-hybrid-fa")

    def corrupt_ssm(a: Replica, b: Replica, ids_a: list[list[int]],
                    ids_b: list[list[int]]) -> None:
        page = spec.page_bytes()
        for pool_a, pool_b in zip(a.pools, b.pools, strict=True):
            for g, (from_ids, to_ids) in enumerate(zip(ids_a, ids_b, strict=True)):
                pairs = list(zip(from_ids, to_ids, strict=True))
                if g < 3:
                    pairs = [p for k, p in enumerate(pairs) if k % 2 == 1]
                for x, y in pairs:
                    pool_b.raw.view(torch.uint8)[y * page:(y + 1) * page] = \
                        pool_a.raw.view(torch.uint8)[x * page:(x + 1) * page]
        b.pools[0].raw.view(torch.uint8)[ids_b[0][1] * spec.page_bytes() + 1152 + 5] ^= 0x5A

    result = hybrid_round_trip(spec, "server", CPU, mutate=corrupt_ssm).check
    assert result.mismatched_pages == 1
    only = result.mismatches[0]
    assert only.group == 0
    assert only.layer.endswith("linear_attn")
    assert (only.count, only.where) == (1, "ssm_state: v_head 0, byte 5")


def test_kernel_native_passes_at_most_four_objects_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA kernel's object limit, as LMCache's gather/scatter batch it."""
    import lmcache

    from pytest_sharedkv.host.lmcache_status import device_ops
    from pytest_sharedkv.packed_page import round_trip

    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(device_ops(lmcache), "multi_layer_block_kv_transfer",
                        _as_compiled_binding(calls), raising=False)
    monkeypatch.setattr(round_trip, "NUM_CHUNKS", 6)
    trip = plain_round_trip(LAYOUTS.get("fa-nhd-bf16"), "kernel-native", CPU)
    assert trip.check.ok, trip.check.describe()
    assert [len(c[1]) for c in calls] == [4, 2, 4, 2]  # type: ignore[arg-type]
