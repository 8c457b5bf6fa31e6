"""The position-coded fill is a pure function of (seed, pool, byte offset): the same bytes
whatever the piece size the fill works in, so a faster fill cannot change what the
packed_page checker compares."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_sharedkv.layouts import fill  # noqa: E402


def _byte(seed: int, pool: int, offset: int) -> int:
    """The documented hash, in Python integers (int64 wrap-around as torch's)."""
    def wrap(x: int) -> int:
        x &= (1 << 64) - 1
        return x - (1 << 64) if x >> 63 else x

    value = wrap(offset * fill._MIX_A + ((seed * 7919 + pool) + 1) * fill._MIX_B)
    value = value ^ (value >> 15)
    value = wrap(value * fill._MIX_C)
    value = value ^ (value >> 12)
    return value & 0xFF


def test_the_fill_is_the_per_byte_hash_across_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fill, "_CPU_CHUNK", 1000)  # pieces end inside the pool
    raw = torch.empty(2600, dtype=torch.bfloat16)  # 5200 bytes: 6 pieces, the last short
    fill.fill_position_coded(raw, seed=11, pool=3)
    flat = raw.view(torch.uint8).view(-1).tolist()
    assert flat == [_byte(11, 3, i) for i in range(5200)]
    big = 3 << 40  # offsets whose products overflow int64: the wrap-around is the hash's
    assert fill.position_bytes(22, 1, big, 64).tolist() == [
        _byte(22, 1, big + i) for i in range(64)]
