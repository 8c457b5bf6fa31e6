"""Where each layer's bytes lie inside one LMCache memory object, and which of them an
engine reads: the placement a fault needs so that it lands in bytes an engine consumes (or,
for a control, in bytes none does), never at a fixed offset.

Read from the cache context the LMCache server registered, through LMCache's own methods
(0.5.6): a memory object of an object group concatenates its kernel groups' regions in the
group's declared order (``BaseCacheContext.get_kernel_group_offset_in_object``,
platform/base/cache_context.py:283; ``TensorMemoryObj.group_prefix_sum``,
memory_management.py:689), each region ``[kv_size, layers, slots, hidden]`` in the group's
dtype (``get_kernel_group_shape_dtype``; GPU: platform/devices/cuda/cache_context.py:264).
A recurrent (GDN/Mamba) kernel group in align mode has a one-block window
(integration/vllm/kv_cache_groups.py:130), so on the GPU its region holds only the chunk's
last block (``get_slots_per_chunk_in_sw``; ``downsample_and_stage_block_ids`` keeps each
chunk's last blocks, object_group_transfer.py:226); its page is vLLM's padded state page
re-viewed as ``[2, block, 1, head]`` (kv_cache_group_edits.py:237), so "plane" 0 and 1 are
the page's two halves, not K and V.

Read by an engine: a block whose engine block id is the null block is written where nobody
reads (vLLM's null block); an align-mode recurrent group's id is null in every chunk but
the one holding the last state, so only the final chunk's state is read. Without the block
ids, that rule stands in for them. Standard library only: it runs inside the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NULL_BLOCK = 0  # vLLM's null block, LMCache's default null_block_id
ATTENTION = "attention-kv"
RECURRENT = "recurrent-state"


@dataclass(frozen=True)
class GroupRegion:
    """One kernel group's region in every memory object of its object group."""

    kernel_group: int
    layers: tuple[int, ...]  # registered layer indices, in the kernel's order
    recurrent: bool
    kv_size: int  # planes: K and V (2), fused K|V per token (1), page halves (2)
    slots: int  # slots per chunk the object holds (a window: fewer than the chunk's)
    hidden: int  # elements per slot
    itemsize: int
    offset: int  # bytes from the object's start
    slots_per_block: int
    chunk_blocks: int  # engine blocks in one chunk of this group

    @property
    def size(self) -> int:
        return self.kv_size * len(self.layers) * self.slots * self.hidden * self.itemsize

    @property
    def blocks(self) -> int:
        """Blocks of each chunk the object holds: the chunk's last ones."""
        return self.slots // self.slots_per_block

    @property
    def kind(self) -> str:
        return RECURRENT if self.recurrent else ATTENTION


@dataclass(frozen=True)
class Span:
    """One layer's bytes of one engine block in one plane of a memory object."""

    layer: int
    name: str
    kind: str
    kernel_group: int
    plane: int
    block: int  # which block of the chunk (0 = its first)
    slot: int  # which block of the group's region (index into its block ids per chunk)
    start: int
    stop: int


@dataclass(frozen=True)
class ObjectLayout:
    object_group: int
    chunk_tokens: int
    regions: tuple[GroupRegion, ...]
    names: tuple[str, ...] = ()  # layer names by registered index, where known

    @property
    def size(self) -> int:
        return sum(r.size for r in self.regions)

    def bytes_per_token(self, kind: str | None = None) -> int:
        """Bytes stored a token (of KIND's regions only, when given)."""
        return sum(r.size for r in self.regions if kind in (None, r.kind)) // self.chunk_tokens

    def layer_name(self, layer: int) -> str:
        return self.names[layer] if layer < len(self.names) else f"layer {layer}"

    def spans(self) -> list[Span]:
        """Every (layer, plane, block) byte range of one object, in offset order."""
        out = []
        for r in self.regions:
            row = r.hidden * r.itemsize
            block_bytes = r.slots_per_block * row
            for position, layer in enumerate(r.layers):
                for plane in range(r.kv_size):
                    base = r.offset + (plane * len(r.layers) + position) * r.slots * row
                    for slot in range(r.blocks):
                        start = base + slot * block_bytes
                        out.append(Span(layer, self.layer_name(layer), r.kind, r.kernel_group,
                                        plane, r.chunk_blocks - r.blocks + slot, slot, start,
                                        start + block_bytes))
        return sorted(out, key=lambda s: s.start)

    def span_at(self, offset: int) -> Span | None:
        """The span holding byte OFFSET of an object (None outside it)."""
        return next((s for s in self.spans() if s.start <= offset < s.stop), None)

    def region_of(self, kernel_group: int) -> GroupRegion:
        return next(r for r in self.regions if r.kernel_group == kernel_group)

    def read_by_engine(self, span: Span, chunk: int, chunks: int,
                       block_ids: Sequence[Sequence[int]] | None = None,
                       skip_tokens: int = 0) -> bool:
        """Whether an engine reads SPAN of chunk CHUNK of an op of CHUNKS chunks: the block
        is written (past the op's skipped tokens) and its engine block id is not the null
        block; without BLOCK_IDS (per kernel group, as the transfer gets them, each chunk's
        ``blocks`` entries), recurrent state only in the op's last chunk."""
        r = self.region_of(span.kernel_group)
        block_tokens = self.chunk_tokens // r.chunk_blocks
        if (chunk * r.chunk_blocks + span.block + 1) * block_tokens <= skip_tokens:
            return False
        if block_ids is not None and span.kernel_group < len(block_ids):
            ids = block_ids[span.kernel_group]
            index = chunk * r.blocks + span.slot
            if index < len(ids):
                return int(ids[index]) != NULL_BLOCK
        return not r.recurrent or chunk == chunks - 1


class LayoutUnreadable(LookupError):
    """The cache context lacks what the layout is read from (another LMCache release)."""


def read_layout(cache_context: Any, object_group: int, names: Sequence[str] = ()
                ) -> ObjectLayout:
    """The layout of OBJECT_GROUP's memory objects, from the registered cache context's
    own methods (nothing re-derived here)."""
    try:
        manager = cache_context.kv_layer_groups_manager
        chunk = int(cache_context.lmcache_tokens_per_chunk)
        members = list(manager.object_groups[object_group].kernel_group_indices)
        regions = []
        for kg in members:
            info = manager.kernel_groups[kg]
            shape, dtype = cache_context.get_kernel_group_shape_dtype(chunk, kg)
            kv_size, _, slots, hidden = (int(x) for x in shape)
            regions.append(GroupRegion(
                kernel_group=kg, layers=tuple(int(i) for i in info.layer_indices),
                recurrent=bool(getattr(info, "recurrent_state", False)), kv_size=kv_size,
                slots=slots, hidden=hidden, itemsize=int(dtype.itemsize),
                offset=int(cache_context.get_kernel_group_offset_in_object(object_group, kg)),
                slots_per_block=int(info.shape_desc.bs),
                chunk_blocks=int(cache_context.calculate_num_blocks(chunk, kg))))
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        raise LayoutUnreadable(f"{type(exc).__name__}: {exc}") from exc
    return ObjectLayout(object_group, chunk, tuple(regions), tuple(names))
