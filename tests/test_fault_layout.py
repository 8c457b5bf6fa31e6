"""Where each layer's bytes lie in an LMCache 0.5.6 memory object, read from the registration
LMCache's own code builds on CPU for the copy model and the 27B geometry, and which of them
an engine reads."""

from __future__ import annotations

import pytest

pytest.importorskip("lmcache")

from pytest_sharedkv.layouts.object_layout import ATTENTION, NULL_BLOCK, RECURRENT
from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict
from pytest_sharedkv.models.geometry_27b import QWEN35_27B_GEOMETRY
from tests.fault_server import server_layout


def test_the_copy_models_chunk_holds_its_attention_and_each_gdn_layers_last_block() -> None:
    """The suite's chunk is two engine blocks of 16 tokens. Every layer rides object group
    0 (no padding between regions); an align-mode GDN layer's one-block window keeps only
    the chunk's last block, its padded state page as two halves."""
    layout = server_layout(config_dict(CopyModelRecipe()), chunk_blocks=2)
    assert layout.chunk_tokens == 32 and layout.size == 65_536
    assert [(r.layers, r.kind, r.offset, r.size, r.blocks) for r in layout.regions] == [
        ((0,), RECURRENT, 0, 16_384, 1),
        ((1,), RECURRENT, 16_384, 16_384, 1),
        ((2,), ATTENTION, 32_768, 32_768, 2)]
    assert layout.bytes_per_token() == 2_048 and layout.bytes_per_token(ATTENTION) == 1_024
    spans = [(s.name, s.plane, s.block, s.start, s.stop) for s in layout.spans()]
    assert spans == [
        ("model.layers.0.linear_attn", 0, 1, 0, 8_192),
        ("model.layers.0.linear_attn", 1, 1, 8_192, 16_384),
        ("model.layers.1.linear_attn", 0, 1, 16_384, 24_576),
        ("model.layers.1.linear_attn", 1, 1, 24_576, 32_768),
        ("model.layers.2.self_attn.attn", 0, 0, 32_768, 49_152),
        ("model.layers.2.self_attn.attn", 0, 1, 49_152, 65_536)]


def test_the_measured_bit_flip_offset_lay_in_state_no_engine_reads() -> None:
    """The H200 run flipped byte 4,170 of a mid-prompt chunk and saw nothing: it is layer
    0's (Gated DeltaNet) state, whose block in a mid-prompt chunk is the null block."""
    layout = server_layout(config_dict(CopyModelRecipe()), chunk_blocks=2)
    span = layout.span_at(4_170)
    assert span is not None and (span.layer, span.kind) == (0, RECURRENT)
    # block ids per kernel group of a 3-chunk retrieve, downsampled as the server stages
    # them: the GDN groups' last block per chunk (null but in the last), attention's two
    ids = [[NULL_BLOCK, NULL_BLOCK, 7], [NULL_BLOCK, NULL_BLOCK, 8], [1, 2, 3, 4, 5, 6]]
    assert [layout.read_by_engine(span, c, 3, ids) for c in range(3)] == [False, False, True]
    assert [layout.read_by_engine(span, c, 3) for c in range(3)] == [False, False, True]
    attention = layout.span_at(40_000)
    assert attention is not None and attention.kind == ATTENTION
    assert all(layout.read_by_engine(attention, c, 3, ids) for c in range(3))
    assert not layout.read_by_engine(attention, 0, 3, ids, skip_tokens=32)  # B's own prefix
    assert layout.span_at(65_536) is None


@pytest.mark.parametrize(("chunk_blocks", "per_token"), [(1, 262_144), (2, 163_840)])
def test_the_27b_geometry_stores_every_layers_page_a_token(chunk_blocks: int,
                                                           per_token: int) -> None:
    """64 layers at one attention layer's 4,096 bytes a token: 262,144 stored for 65,536 of
    KV, where a chunk is one engine block (784 tokens). At the suite's two-block chunk the
    48 GDN layers keep one block of the two (their one-block window): 65,536 + 98,304."""
    layout = server_layout(QWEN35_27B_GEOMETRY, chunk_blocks=chunk_blocks)
    assert layout.chunk_tokens == 784 * chunk_blocks
    assert layout.bytes_per_token() == per_token
    assert layout.bytes_per_token(ATTENTION) == 65_536
    kinds = {r.kind: sum(len(g.layers) for g in layout.regions if g.kind == r.kind)
             for r in layout.regions}
    assert kinds == {ATTENTION: 16, RECURRENT: 48}
    assert sum(s.stop - s.start for s in layout.spans()) == layout.size
