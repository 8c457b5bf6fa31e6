"""vLLM's own CPU offload (``--kv-offloading-backend native``, the ``OffloadingConnector``)
under the service tier: the flags that make its CPU tier, not the GPU's prefix cache, serve
the local and receiver-local steps, and the prompts that sit at and beside its block
boundaries. The perf tier launches the same backend as its NATIVE arm; the service tier
judges its answers and hits by ``service/expected_hits.py``'s native table.

Read from vLLM 0.26.0:

* ``--kv-offloading-size GB`` becomes ``cpu_bytes_to_use`` in the connector's extra config
  (``config/vllm.py`` ``_post_init_kv_transfer_config``), per replica; its CPU blocks are
  that over the bytes of one offload chunk, ``blocks_per_chunk`` GPU blocks (default 1:
  the offload block is the engine's block) (``v1/kv_offload/cpu/spec.py``,
  ``distributed/kv_transfer/kv_connector/v1/offloading/config.py``).
  ``VLLM_USE_SIMPLE_KV_OFFLOAD=1`` selects ``SimpleCPUOffloadConnector`` instead.
* The GPU cache is sized by blocks (``--num-gpu-blocks-override``): what evicts a prompt
  is a count of blocks, whatever bytes a block holds (for a hybrid model the attention
  block is padded to hold the Gated DeltaNet state). vLLM still refuses a cache smaller
  than one request of ``--max-model-len``.
* With prefix caching on, a hybrid model whose class lacks ``SupportsMambaPrefixCaching``
  (Qwen3-Next: the copy model) runs ``mamba_cache_mode`` ``align`` whatever is asked:
  ``none`` becomes ``align`` and ``all`` falls back to it with a warning
  (``model_executor/models/config.py`` ``MambaModelConfig``). ``all`` runs only for the
  Mamba-family hybrids that declare it (Jamba, Nemotron-H, Granite MoE hybrid, Falcon-H1,
  Zamba2, Mamba, Mamba2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import ceil
from typing import TYPE_CHECKING, Any

from pytest_sharedkv.config.stack_choice import MAMBA_TYPES, is_hybrid

if TYPE_CHECKING:
    from pytest_sharedkv.corpus.cases import Case
    from pytest_sharedkv.corpus.copy_corpus import Request

SIMPLE_ENV = "VLLM_USE_SIMPLE_KV_OFFLOAD"
# model_type -> the mamba_cache_mode values vLLM 0.26 runs with prefix caching on
ALIGN_ONLY = ("align",)
ALIGN_AND_ALL = ("align", "all")
ALL_CAPABLE = MAMBA_TYPES  # the hybrids that run mamba_cache_mode all
GDN_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_moe"})


class NativeOffloadError(ValueError):
    """A configuration that would not exercise the CPU tier, or cannot start; ``field``
    names the input."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def mamba_cache_modes(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``--mamba-cache-mode`` values vLLM 0.26 runs for this model with prefix caching
    on, each a distinct configuration; () for an attention-only model (no such flag)."""
    if not is_hybrid(config):
        return ()
    return ALIGN_AND_ALL if str(config.get("model_type", "")) in ALL_CAPABLE else ALIGN_ONLY


def attention_bytes_per_token(config: Mapping[str, Any], dtype_bytes: int = 2) -> int:
    """KV bytes one token takes in an attention-only model (K and V, every layer)."""
    if is_hybrid(config):
        raise NativeOffloadError("model", "a hybrid model's bytes per token depend on the "
                                 "engine's padded pages; give them explicitly")
    heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    head_dim = int(config.get("head_dim")
                   or int(config["hidden_size"]) // int(config["num_attention_heads"]))
    return 2 * int(config["num_hidden_layers"]) * heads * head_dim * dtype_bytes


def gpu_blocks(group_tokens: int, longest_prompt: int, answer_tokens: int,
               concurrency: int, block_size: int, max_model_len: int) -> int:
    """The GPU cache, in blocks, for a size group of GROUP_TOKENS prompt tokens: room for
    the requests in flight (CONCURRENCY of the longest prompt and its answer) and one
    request of MAX_MODEL_LEN (vLLM's admission check), and no more, so that the group
    cannot stay on the GPU between its cold and its local step. NativeOffloadError where
    the group would fit anyway (no local hit would come from the CPU tier)."""
    for name, value in (("block_size", block_size), ("concurrency", concurrency),
                        ("group_tokens", group_tokens), ("max_model_len", max_model_len)):
        if value <= 0:
            raise NativeOffloadError(name, f"must be > 0, not {value}")
    in_flight = concurrency * ceil((longest_prompt + answer_tokens) / block_size)
    blocks = max(in_flight, ceil(max_model_len / block_size)) + 1  # vLLM's null block
    if blocks * block_size >= group_tokens // 2:
        raise NativeOffloadError(
            "group_tokens", f"{group_tokens} prompt tokens would stay on a GPU cache of "
            f"{blocks} blocks of {block_size} (it must hold at least the requests in "
            f"flight and one of --max-model-len {max_model_len}): send a group of at "
            f"least {2 * blocks * block_size + 1} tokens, or fewer at once")
    return blocks


def cpu_gb(group_tokens: int, bytes_per_token: int, headroom: float = 2.0) -> float:
    """A CPU tier (GB, as ``--kv-offloading-size`` reads it) that holds the whole group
    HEADROOM times over, so the CPU tier itself evicts nothing the local step asks for."""
    if bytes_per_token <= 0:
        raise NativeOffloadError("bytes_per_token", f"must be > 0, not {bytes_per_token}")
    gib = group_tokens * bytes_per_token * headroom / (1 << 30)
    return max(round(gib, 2), 0.01)


def boundary_lengths(offload_block: int, blocks: Sequence[int]) -> list[int]:
    """Prompt lengths (tokens, ``<s>`` included) one short of, at and one past each count
    of whole offload blocks: a full-block prompt is where vLLM recomputes its last token
    and a load ends on a chunk edge (vLLM #51094's condition)."""
    if offload_block <= 0:
        raise NativeOffloadError("offload_block", f"must be > 0, not {offload_block}")
    out: list[int] = []
    for count in blocks:
        if count < 2:
            raise NativeOffloadError("blocks", f"a boundary case needs >= 2 blocks, not {count}")
        edge = count * offload_block
        out += [edge - 1, edge, edge + 1]
    return out


@dataclass(frozen=True)
class NativeOffloadPlan:
    """The service tier's native-offload launch: the flags (the same for both replicas:
    each has a CPU tier of its own) and what they were computed from."""

    cpu_gb: float
    gpu_blocks: int
    block_size: int  # the engine's; the offload block (blocks_per_chunk 1)
    mamba_cache_mode: str | None = None
    simple_connector: bool = False  # SimpleCPUOffloadConnector (vLLM #45704's path)
    bytes_per_token: int | None = None  # where known: the GPU cache in bytes

    def __post_init__(self) -> None:
        if not self.cpu_gb > 0:
            raise NativeOffloadError("cpu_gb", f"must be > 0, not {self.cpu_gb:g}")
        if self.gpu_blocks <= 0:
            raise NativeOffloadError("gpu_blocks", f"must be > 0, not {self.gpu_blocks}")
        if self.mamba_cache_mode not in (None, *ALIGN_AND_ALL):
            raise NativeOffloadError("mamba_cache_mode",
                                     f"one of {ALIGN_AND_ALL}, not {self.mamba_cache_mode!r}")

    @property
    def offload_block(self) -> int:
        return self.block_size

    @property
    def gpu_bytes(self) -> int | None:
        """The GPU cache in bytes (``--kv-cache-memory-bytes``, so two replicas can start
        together on one GPU), where the bytes per token are known."""
        if self.bytes_per_token is None:
            return None
        return self.gpu_blocks * self.block_size * self.bytes_per_token

    def argv(self) -> list[str]:
        flags = ["--kv-offloading-backend", "native", "--kv-offloading-size",
                 f"{self.cpu_gb:g}", "--num-gpu-blocks-override", str(self.gpu_blocks),
                 "--enable-prefix-caching"]
        if self.mamba_cache_mode is not None:
            flags += ["--mamba-cache-mode", self.mamba_cache_mode]
        return flags

    def env(self) -> dict[str, str]:
        return {SIMPLE_ENV: "1"} if self.simple_connector else {}

    def record(self) -> dict[str, Any]:
        return {"connector": ("SimpleCPUOffloadConnector" if self.simple_connector
                              else "OffloadingConnector"),
                "backend": "CPU", "cpu_gb": self.cpu_gb, "gpu_blocks": self.gpu_blocks,
                "block_size": self.block_size, "mamba_cache_mode": self.mamba_cache_mode}


def native_plans(config: Mapping[str, Any], group_tokens: int, longest_prompt: int,
                 answer_tokens: int, concurrency: int, block_size: int, max_model_len: int,
                 bytes_per_token: int, simple_connector: bool = False
                 ) -> list[NativeOffloadPlan]:
    """One plan per ``mamba_cache_mode`` vLLM 0.26 runs for the model (one plan without the
    flag for an attention-only model)."""
    blocks = gpu_blocks(group_tokens, longest_prompt, answer_tokens, concurrency,
                        block_size, max_model_len)
    tier = cpu_gb(group_tokens, bytes_per_token)
    modes: Sequence[str | None] = mamba_cache_modes(config) or (None,)
    return [NativeOffloadPlan(tier, blocks, block_size, mode, simple_connector,
                              bytes_per_token) for mode in modes]


def boundary_requests(offload_block: int, blocks: Sequence[int], chunk: int,
                      seed: str = "native-boundary") -> list[Request]:
    """Copy-corpus requests at each of ``boundary_lengths`` (one a length, its source in
    the first chunk: the answer needs the blocks loaded from the CPU tier), expected
    answers by construction."""
    from pytest_sharedkv.corpus.copy_corpus import make_request
    from pytest_sharedkv.models.copy_model import CopyModelRecipe

    recipe = CopyModelRecipe()
    out = []
    for length in boundary_lengths(offload_block, blocks):
        rid = f"boundary-{length}"
        request, _ = make_request(rid, f"{length}t", f"{seed}/{rid}", length, chunk, 0,
                                  recipe)
        out.append(request)
    return out


BOUNDARY = "boundary"  # the size the boundary cases carry
# the prompt lengths the service tier's boundary stage aims its edges at: short, so a GPU
# answers them, and the prompts that push them off its GPU cache, in seconds
BOUNDARY_TOKENS = (1024, 2048)


def boundary_blocks(offload_block: int, chunk: int | None,
                    tokens: Sequence[int] = BOUNDARY_TOKENS) -> list[int]:
    """Counts of whole offload blocks for ``boundary_lengths``: the first edge at or past
    each of TOKENS that is also a CHUNK's edge where a chunk is whole blocks (the copy
    corpus's prompts are built to chunks), at least 2, each once."""
    if offload_block <= 0:
        raise NativeOffloadError("offload_block", f"must be > 0, not {offload_block}")
    step = chunk // offload_block if chunk and chunk % offload_block == 0 else 1
    counts: list[int] = []
    for target in tokens:
        count = max(2, ceil(target / (offload_block * step)) * step)
        if count not in counts:
            counts.append(count)
    return counts


ALL_BUT_LAST = "all-but-last"  # whole blocks of all but the last token (the stub's rule)
WHOLE_PROMPT = "whole-prompt"  # vLLM's connectors, an attention-only model
STATE_ALIGNED = "state-aligned"  # vLLM's connectors, a hybrid under mamba_cache_mode align
VLLM_CONNECTORS = ("OffloadingConnector", "SimpleCPUOffloadConnector")


def hit_rule(stack: Mapping[str, Any]) -> str:
    """The full hit a native launch record's stack gives a prompt at a block edge
    (``boundary_cached``): vLLM's connectors by the model (``mamba_cache_mode`` align
    for a hybrid, none for an attention-only model), the stub double its own rule."""
    if stack.get("connector") not in VLLM_CONNECTORS:
        return ALL_BUT_LAST
    return STATE_ALIGNED if stack.get("mamba_cache_mode") == "align" else WHOLE_PROMPT


def boundary_cached(prompt_tokens: int, block: int, rule: str = ALL_BUT_LAST) -> int:
    """The cached tokens a full hit gives a PROMPT_TOKENS prompt under RULE.

    ALL_BUT_LAST: whole blocks of all but its last token, so n blocks exactly hit n-1 of
    them and one token more hits all n. The others are vLLM 0.26.0's offloading scheduler
    (``_lookup``), each measured on the H200:

    WHOLE_PROMPT (an attention-only model): the hit may reach the prompt's end, so a
    prompt of whole blocks is loaded whole (the scheduler then recomputes its last token,
    ``_update_waiting_for_remote_kv``, and the response counts all n cached); otherwise
    whole blocks.

    STATE_ALIGNED (a hybrid under ``mamba_cache_mode`` ``align``): the hit ends one token
    short, rounded down to the block, and the recurrent group is looked up as a window of
    one block (``get_sliding_window_size_in_chunks``), so it needs a state kept at that
    block's end. ``align`` keeps one only where a prefill step ends: a prompt of whole
    blocks prefilled in one step (the boundary prompts, under vLLM's default step budget)
    ends at its last block, one past the hit, and reloads nothing (both connectors)."""
    if block <= 0 or prompt_tokens <= 0:
        raise NativeOffloadError("block", f"a block and a prompt must be > 0, not {block}, "
                                 f"{prompt_tokens}")
    whole = prompt_tokens % block == 0
    if rule == WHOLE_PROMPT:
        return prompt_tokens // block * block
    if rule == STATE_ALIGNED and whole:
        return 0
    return (prompt_tokens - 1) // block * block


def boundary_cases(offload_block: int, blocks: Sequence[int], chunk: int) -> list[Case]:
    """``boundary_requests`` as the service tier's cases (size ``boundary``, measured),
    their payloads made when first sent; each one's full hit is ``boundary_cached``."""
    import functools

    from pytest_sharedkv.corpus.cases import Case
    from pytest_sharedkv.corpus.copy_corpus import make_request
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, text_of

    recipe = CopyModelRecipe()

    def payload(rid: str, seed: str, length: int) -> str:
        return text_of(make_request(rid, BOUNDARY, seed, length, chunk, 0, recipe)[1], recipe)

    return [Case(r.id, "measured", BOUNDARY,
                 functools.partial(payload, r.id, r.seed, r.prompt_tokens), r.sha256,
                 r.prompt_tokens, r.expected, r.source_chunk)
            for r in boundary_requests(offload_block, blocks, chunk)]
