"""vLLM's native offload under the service tier: the GPU cache it is given cannot keep a
size group between its cold and its local step (an LRU of that many blocks, fed the group
twice in order, finds nothing the second time) yet holds the requests in flight and one of
--max-model-len; the CPU tier holds the group; the mamba_cache_mode values are the ones
vLLM 0.26 runs for the model; the boundary prompts sit one short of, at and one past whole
offload blocks, with answers the copy rule gives."""

from __future__ import annotations

from collections import OrderedDict
from math import ceil
from typing import Any

import pytest

from pytest_sharedkv.stack.launch.native_offload import (
    NativeOffloadError,
    NativeOffloadPlan,
    attention_bytes_per_token,
    boundary_lengths,
    boundary_requests,
    cpu_gb,
    gpu_blocks,
    mamba_cache_modes,
    native_plans,
)

BLOCK = 16
# the service tier's 3k group: 200 prompts of 3009 tokens, 16 answer tokens, 16 at once
GROUP: dict[str, Any] = {"group_tokens": 200 * 3009, "longest_prompt": 3009, "answer_tokens": 16,
         "concurrency": 16, "block_size": BLOCK, "max_model_len": 4096}


def lru_second_pass_hits(capacity: int, prompts: int, blocks_each: int) -> int:
    """Blocks of a group found in an LRU cache of CAPACITY blocks when the group's
    PROMPTS (BLOCKS_EACH distinct blocks each) are sent once, then again, in order."""
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    hits = 0
    for second in (False, True):
        for p in range(prompts):
            for b in range(blocks_each):
                key = (p, b)
                if key in cache:
                    hits += second
                    cache.move_to_end(key)
                else:
                    cache[key] = None
                    if len(cache) > capacity:
                        cache.popitem(last=False)
    return hits


def test_the_gpu_cache_cannot_keep_the_group_but_serves_it() -> None:
    blocks = gpu_blocks(**GROUP)
    assert blocks * BLOCK >= GROUP["max_model_len"]  # vLLM's admission check
    assert blocks * BLOCK >= GROUP["concurrency"] * (3009 + 16)  # the requests in flight
    assert lru_second_pass_hits(blocks, 200, ceil(3009 / BLOCK)) == 0


def test_a_group_the_gpu_would_keep_is_refused() -> None:
    with pytest.raises(NativeOffloadError) as err:
        gpu_blocks(**{**GROUP, "group_tokens": 20 * 3009})
    assert err.value.field == "group_tokens"
    with pytest.raises(NativeOffloadError) as err:
        gpu_blocks(**{**GROUP, "block_size": 0})
    assert err.value.field == "block_size"


def test_the_cpu_tier_holds_the_group() -> None:
    from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe, config_dict

    per_token = attention_bytes_per_token(config_dict(AttentionCopyRecipe()))
    assert per_token == 2 * 2 * 5 * 256 * 2  # K and V, 2 layers, 5 heads of 256, bf16
    assert cpu_gb(GROUP["group_tokens"], per_token) * (1 << 30) >= (
        GROUP["group_tokens"] * per_token)


def test_mamba_cache_modes_are_what_vllm_026_runs() -> None:
    from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe
    from pytest_sharedkv.models.copy_attention_model import config_dict as attention
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict

    assert mamba_cache_modes(config_dict(CopyModelRecipe())) == ("align",)  # Qwen3-Next
    assert mamba_cache_modes(attention(AttentionCopyRecipe())) == ()
    assert mamba_cache_modes({"model_type": "jamba"}) == ("align", "all")
    with pytest.raises(NativeOffloadError):
        attention_bytes_per_token(config_dict(CopyModelRecipe()))


def test_plans_carry_the_flags() -> None:
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict

    (plan,) = native_plans(config_dict(CopyModelRecipe()), bytes_per_token=1024, **GROUP)
    argv = plan.argv()
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == str(gpu_blocks(**GROUP))
    assert argv[argv.index("--mamba-cache-mode") + 1] == "align"
    assert plan.env() == {}
    assert plan.gpu_bytes == plan.gpu_blocks * BLOCK * 1024
    simple = NativeOffloadPlan(1.0, 300, BLOCK, simple_connector=True)
    assert simple.env() == {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}
    assert simple.record()["connector"] == "SimpleCPUOffloadConnector"
    with pytest.raises(NativeOffloadError):
        NativeOffloadPlan(1.0, 300, BLOCK, mamba_cache_mode="none")


def test_boundary_prompts_straddle_whole_offload_blocks() -> None:
    from pytest_sharedkv.models.copy_model import CopyModelRecipe
    from pytest_sharedkv.models.copy_rule import continue_ids

    assert boundary_lengths(BLOCK, (64,)) == [1023, 1024, 1025]
    requests = boundary_requests(BLOCK, (64,), chunk=32)
    assert [r.prompt_tokens for r in requests] == [1023, 1024, 1025]
    recipe = CopyModelRecipe()
    from pytest_sharedkv.corpus.copy_corpus import _document

    for request in requests:
        words, source, _ = _document(request.seed, request.prompt_tokens, 32,
                                     request.source_chunk, recipe)
        ids = [0, *words]
        assert len(ids) == request.prompt_tokens
        assert source < 32  # copied from the first chunk: the blocks the CPU tier serves
        steps = len(request.expected)
        assert tuple(continue_ids(ids, steps, miss=4)) == request.expected


def test_a_full_hit_at_a_block_edge_is_whole_blocks_short_of_the_last_token() -> None:
    from pytest_sharedkv.stack.launch.native_offload import boundary_cached

    assert [boundary_cached(n, BLOCK) for n in boundary_lengths(BLOCK, (64,))] == [
        1008, 1008, 1024]  # one short of, at, one past 64 blocks
    with pytest.raises(NativeOffloadError):
        boundary_cached(1024, 0)


def test_vllm_connectors_hit_a_prompt_of_whole_blocks_by_the_model() -> None:
    from pytest_sharedkv.stack.launch.native_offload import (
        ALL_BUT_LAST,
        STATE_ALIGNED,
        WHOLE_PROMPT,
        boundary_cached,
        hit_rule,
    )

    lengths = boundary_lengths(BLOCK, (64, 128))
    # the H200 runs: both connectors on the copy model (a hybrid, align) ...
    assert [boundary_cached(n, BLOCK, STATE_ALIGNED) for n in lengths] == [
        1008, 0, 1024, 2032, 0, 2048]
    # ... and the OffloadingConnector on the attention-only copy model
    assert [boundary_cached(n, BLOCK, WHOLE_PROMPT) for n in lengths] == [
        1008, 1024, 1024, 2032, 2048, 2048]
    assert hit_rule({"connector": "OffloadingConnector", "mamba_cache_mode": "align"}) \
        == STATE_ALIGNED
    assert hit_rule({"connector": "SimpleCPUOffloadConnector",
                     "mamba_cache_mode": None}) == WHOLE_PROMPT
    assert hit_rule({"connector": "stub", "mamba_cache_mode": "align"}) == ALL_BUT_LAST


def test_boundary_cases_are_the_requests_the_service_tier_sends() -> None:
    import hashlib

    from pytest_sharedkv.stack.launch.native_offload import BOUNDARY, boundary_cases

    requests = boundary_requests(BLOCK, (64,), chunk=32)
    cases = boundary_cases(BLOCK, (64,), chunk=32)
    assert [(c.id, c.size, c.role, c.prompt_tokens, c.expected, c.source_chunk)
            for c in cases] == [(r.id, BOUNDARY, "measured", r.prompt_tokens, r.expected,
                                 r.source_chunk) for r in requests]
    for case in cases:  # the payload made on first use is the one its digest names
        assert hashlib.sha256(case.text.encode()).hexdigest() == case.sha256


def test_the_boundary_blocks_keep_prompts_short_and_on_chunk_edges() -> None:
    from pytest_sharedkv.stack.launch.native_offload import boundary_blocks

    assert boundary_blocks(16, 32) == [64, 128]  # 16-token blocks, 32-token chunks
    assert boundary_blocks(32, 32) == [32, 64]  # the stub: block = chunk
    assert boundary_blocks(544, 1088) == [2, 4]  # a big hybrid block: whole chunks, >= 2
    assert boundary_blocks(24, 32) == [43, 86]  # a chunk not whole blocks: blocks only
    with pytest.raises(NativeOffloadError):
        boundary_blocks(0, 32)
