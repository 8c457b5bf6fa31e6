"""Position-coded bytes, and the page geometry that names where a byte lives.

Each byte of a raw pool gets a hash of (replica seed, pool, byte offset). A pool's bytes
map one-to-one onto (kernel group, layer, block, token, head, byte) through the pool's
block owners and page geometry, so the fill is a function of those coordinates and a
wrong byte can be named exactly. Random bytes also form NaN and denormal bit patterns in
bf16/fp16/fp32, which proves no transfer path does arithmetic on KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MIX_A = 0x9E3779B1
_MIX_B = 0x85EBCA77
_MIX_C = 0x2C1B3C6D
_CHUNK = 1 << 24  # fill in pieces: bounded int64 scratch on large pools
# On CPU a piece whose int64 scratch (8 MiB) stays in cache: 16x faster than 16 Mi pieces,
# whose fresh 128 MiB scratch per step was mostly page faults (a 1,568-token hybrid
# replica pair took 2.9 s to fill).
_CPU_CHUNK = 1 << 20


def position_bytes(seed: int, pool: int, start: int, count: int,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    value = torch.arange(start, start + count, dtype=torch.int64, device=device)
    value.mul_(_MIX_A).add_(((seed * 7919 + pool) + 1) * _MIX_B)  # in place: one scratch
    value.bitwise_xor_(value >> 15)
    value.mul_(_MIX_C)
    value.bitwise_xor_(value >> 12)
    return value.bitwise_and_(0xFF).to(torch.uint8)


def fill_position_coded(raw: torch.Tensor, seed: int, pool: int) -> None:
    flat = raw.view(torch.uint8).view(-1)
    chunk = _CPU_CHUNK if flat.device.type == "cpu" else _CHUNK
    for start in range(0, flat.numel(), chunk):
        count = min(chunk, flat.numel() - start)
        flat[start:start + count] = position_bytes(seed, pool, start, count, flat.device)


@dataclass(frozen=True)
class Region:
    """A named stretch of a page, split into dimensions (outermost first, sizes in units;
    the last dimension is bytes)."""

    name: str
    offset: int
    dims: tuple[tuple[str, int], ...]

    @property
    def nbytes(self) -> int:
        total = 1
        for _, size in self.dims:
            total *= size
        return total

    def coordinates(self, offset_in_region: int) -> dict[str, int]:
        coords: dict[str, int] = {}
        rest = offset_in_region
        for index, (name, _size) in enumerate(self.dims):
            inner = 1
            for _, size in self.dims[index + 1:]:
                inner *= size
            coords[name], rest = divmod(rest, inner)
        return coords


@dataclass(frozen=True)
class PageMap:
    regions: list[Region]

    def locate(self, offset: int) -> str:
        for region in self.regions:
            if region.offset <= offset < region.offset + region.nbytes:
                coords = region.coordinates(offset - region.offset)
                if "kernel_page" in coords and "token" in coords:
                    # tokens of a logical block that spans several kernel pages
                    width = next(size for name, size in region.dims if name == "token")
                    coords["token"] += coords.pop("kernel_page") * width
                text = ", ".join(f"{k} {v}" for k, v in coords.items())
                return f"{region.name}: {text}"
        return f"page byte {offset}"
