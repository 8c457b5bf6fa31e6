"""KV layouts the packed_page tier builds, declared without torch (the registry and defaults).

A layout names the engine geometry (family, backend, generation, heads, head size, dtype,
block sizes, layer count) in plain values. ``build.py`` turns it into the exact tensors
vLLM registers; other plugins add layouts with ``pytest_sharedkv_layouts(registry)``.

Sources (vLLM 0.26.0 unless said otherwise):
  FlashAttention / FlashInfer shape and stride order: vllm/v1/attention/backends/
  flash_attn.py (get_kv_cache_shape, get_kv_cache_stride_order), flashinfer.py;
  MLA: vllm/model_executor/layers/attention/mla_attention.py; views over the raw pool:
  vllm/v1/worker/gpu/attn_utils.py (_reshape_attention_kv_cache, _reshape_kv_cache);
  hybrid block-size alignment: vllm/platforms/interface.py (_align_hybrid_block_size) and
  vllm/v1/worker/utils.py (select_common_block_size); GDN state shapes:
  vllm/model_executor/layers/mamba/mamba_utils.py (gated_delta_net_state_shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import ceil, prod

from pytest_sharedkv.config.registry import Registry

FAMILIES = ("attention", "mla", "hybrid")
GENERATIONS = ("vllm026", "vllm025", "legacy")
BACKENDS = ("FLASH_ATTN", "FLASHINFER")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "uint8": 1}

# Kernel block sizes each backend accepts (get_supported_kernel_block_sizes):
# FlashAttention any multiple of 16, FlashInfer a fixed list.
KERNEL_SIZES: dict[str, tuple[str, tuple[int, ...]]] = {
    "FLASH_ATTN": ("multiple-of", (16,)),
    "FLASHINFER": ("one-of", (16, 32, 64)),
}


@dataclass(frozen=True)
class LayoutSpec:
    """One engine KV layout at a size small enough for CPU CI (or as large as you like)."""

    name: str
    family: str
    doc: str
    backend: str = "FLASH_ATTN"
    generation: str = "vllm026"
    kv_layout: str = "NHD"
    num_layers: int = 3
    num_kv_heads: int = 2
    head_dim: int = 8
    dtype: str = "bfloat16"
    block_size: int = 16  # --block-size; hybrid models raise the attention block above it
    num_blocks: int = 16
    mla_head_size: int = 576  # kv_lora_rank + qk_rope_head_dim (512 + 64)
    # hybrid (Gated DeltaNet + full attention, Qwen3-Next / Qwen3.5 family)
    full_attention_interval: int = 4
    lin_k_heads: int = 2
    lin_v_heads: int = 8
    lin_k_dim: int = 16
    lin_v_dim: int = 16
    conv_kernel: int = 4
    ssm_dtype: str = "float32"
    tags: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"layout {self.name}: family must be one of {FAMILIES}")
        if self.generation not in GENERATIONS:
            raise ValueError(f"layout {self.name}: generation must be one of {GENERATIONS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"layout {self.name}: backend must be one of {BACKENDS}")
        if self.kv_layout not in ("NHD", "HND"):
            raise ValueError(f"layout {self.name}: kv_layout must be NHD or HND")
        for dt in (self.dtype, self.ssm_dtype):
            if dt not in DTYPE_BYTES:
                raise ValueError(f"layout {self.name}: dtype {dt!r} not in {sorted(DTYPE_BYTES)}")

    # -- hybrid geometry (pure arithmetic, mirrored from vLLM; see module docstring) --------

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def gdn_state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv, ssm) shapes per block, TP=1, SD conv layout."""
        conv_dim = self.lin_k_dim * self.lin_k_heads * 2 + self.lin_v_dim * self.lin_v_heads
        return (self.conv_kernel - 1, conv_dim), (self.lin_v_heads, self.lin_v_dim, self.lin_k_dim)

    def mamba_page_unpadded(self) -> int:
        conv, ssm = self.gdn_state_shapes()
        return prod(conv) * self.itemsize + prod(ssm) * DTYPE_BYTES[self.ssm_dtype]

    def attn_bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.itemsize

    def logical_block_size(self) -> int:
        """Platform._align_hybrid_block_size, align mode (prefix caching on)."""
        if self.family != "hybrid":
            return self.block_size
        _, sizes = KERNEL_SIZES[self.backend]
        align = max(min(sizes), self.block_size)
        return align * ceil(self.mamba_page_unpadded() / (align * self.attn_bytes_per_token()))

    def kernel_block_size(self) -> int:
        """select_common_block_size: the logical block if the kernel takes it, else the
        largest fixed size that divides it (so one logical block spans many kernel pages)."""
        logical = self.logical_block_size()
        kind, sizes = KERNEL_SIZES[self.backend]
        if kind == "multiple-of":
            return logical
        if logical in sizes:
            return logical
        for size in sorted(sizes, reverse=True):
            if logical % size == 0:
                return size
        raise ValueError(f"layout {self.name}: no kernel block size divides {logical}")

    def page_bytes(self) -> int:
        """Bytes of one logical block of one layer in the raw pool."""
        if self.family == "mla":
            return self.block_size * self.mla_head_size * self.itemsize
        return self.logical_block_size() * self.attn_bytes_per_token()

    def describe(self) -> str:
        if self.family == "hybrid":
            logical, kernel = self.logical_block_size(), self.kernel_block_size()
            return (f"{self.backend} {self.kv_layout}, logical block {logical} tokens = "
                    f"{logical // kernel} kernel page(s) of {kernel}; page {self.page_bytes()} B, "
                    f"GDN state {self.mamba_page_unpadded()} B + "
                    f"{self.page_bytes() - self.mamba_page_unpadded()} B padding")
        return (f"{self.generation} {self.family} {self.backend} {self.kv_layout} {self.dtype}, "
                f"{self.num_layers} layers, page {self.page_bytes()} B")


class LayoutRegistry(Registry[LayoutSpec]):
    kind = "layout"


_TINY_GDN = LayoutSpec("tiny-gdn", "hybrid", "", num_layers=8, head_dim=16, num_blocks=28)

DEFAULT_LAYOUTS: tuple[LayoutSpec, ...] = (
    LayoutSpec("fa-nhd-bf16", "attention",
               "vLLM 0.26 FlashAttention, NHD: (NB, H, BS, 2*D) viewed over physical "
               "(NB, BS, H, 2*D), K|V fused per token and head (flash_attn.py)"),
    LayoutSpec("fa-nhd-fp8", "attention",
               "vLLM 0.26 FlashAttention NHD with an fp8 KV cache, stored as uint8 "
               "(vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE; flash_attn.py)",
               dtype="fp8"),
    LayoutSpec("flashinfer-hnd-bf16", "attention",
               "vLLM 0.26 FlashInfer, HND: physical (NB, H, BS, 2*D) (flashinfer.py)",
               backend="FLASHINFER", kv_layout="HND"),
    LayoutSpec("fa-rank5-nhd-bf16", "attention",
               "vLLM 0.25 FlashAttention/FlashInfer rank-5 pages (NB, 2, BS, H, D) "
               "(vllm 0.25.0 vllm/v1/attention/backends/flash_attn.py get_kv_cache_shape)",
               generation="vllm025"),
    LayoutSpec("fa-legacy-nhd-fp16", "attention",
               "older FlashAttention (2, NB, BS, H, D): K plane then V plane "
               "(vllm < 0.25 vllm/v1/attention/backends/flash_attn.py)", dtype="float16",
               generation="legacy"),
    LayoutSpec("mla-bf16-576", "mla",
               "vLLM 0.26 MLA latent cache (NB, BS, 576) bf16 (mla_attention.py)"),
    LayoutSpec("mla-fp8-ds-656", "mla",
               "vLLM 0.26 FlashMLA fp8_ds_mla: uint8, 656 bytes per token, block 64 "
               "(vllm/v1/kv_cache_interface.py MLAAttentionSpec; mla/flashmla.py)",
               dtype="uint8", mla_head_size=656, block_size=64, num_blocks=12),
    replace(_TINY_GDN, name="gdn-hybrid-fa",
            doc="Gated DeltaNet + full attention (Qwen3-Next shape, tiny), FlashAttention: "
                "logical block 80 = one kernel page (platforms/interface.py "
                "_align_hybrid_block_size; worker/gpu/attn_utils.py _reshape_kv_cache)"),
    replace(_TINY_GDN, name="gdn-hybrid-flashinfer", backend="FLASHINFER",
            doc="Gated DeltaNet + full attention (tiny), FlashInfer: logical block 80 spans 5 "
                "packed kernel pages of 16 (worker/utils.py select_common_block_size)"),
    LayoutSpec("gdn-hybrid-flashinfer-1568", "hybrid",
               "the field geometry: a 1,568-token logical block over 49 FlashInfer pages of 32 "
               "(1 KV head x 256; GDN state (3, 5120) bf16 + (24, 128, 128) fp32; "
               "mamba/mamba_utils.py gated_delta_net_state_shape)",
               backend="FLASHINFER", num_layers=4, num_kv_heads=1, head_dim=256, lin_k_heads=8,
               lin_v_heads=24, lin_k_dim=128, lin_v_dim=128, num_blocks=24),
    # Qwen3-Next-80B-A3B per-layer dimensions at TP=1 (2 KV heads x 256; GDN 16 k-heads and
    # 32 v-heads of 128, conv kernel 4; bf16 SSM state, mamba_ssm_cache_dtype="auto").
    LayoutSpec("gdn-qwen3next-80b-flashinfer", "hybrid",
               "Qwen3-Next-80B-A3B per-layer dims, TP=1: logical block 544 = 17 FlashInfer "
               "pages of 32 (transformers_utils/configs/qwen3_next.py; models/qwen3_next.py)",
               backend="FLASHINFER", num_layers=4, num_kv_heads=2, head_dim=256,
               lin_k_heads=16, lin_v_heads=32, lin_k_dim=128, lin_v_dim=128,
               ssm_dtype="bfloat16", num_blocks=24),
)


def default_registry() -> LayoutRegistry:
    registry = LayoutRegistry()
    for layout in DEFAULT_LAYOUTS:
        registry.add(layout)
    return registry
