"""The geometry of Qwen3.5-27B: the fields of its ``config.json`` (``text_config``) that
decide how many bytes of KV and recurrent state a prompt needs, so the perf tier can serve
a random-weight model of the same shape (and the floor can be computed for it) without
downloading the real one.

Where the values were read (2026, through the documentation search, not downloaded):

- Qwen's model card for ``Qwen/Qwen3.5-27B`` (README, as changed in commit 3b29628,
  https://huggingface.co/Qwen/Qwen3.5-27B/commit/3b2962802c141fcffb992b4e13e4cf9012fdaa13):
  27B parameters, hidden dimension 5120, 64 layers laid out as
  16 x (3 x (Gated DeltaNet -> FFN) -> 1 x (Gated Attention -> FFN)), token embedding
  248320 (padded).
- The ``text_config`` fields themselves from published copies of that ``config.json``
  (the ``Qwen/Qwen3.5-27B`` file page was not among the searchable documents):
  https://huggingface.co/EclipseMist/hababa/blob/main/config.json
  (``Qwen3_5ForConditionalGeneration``: hidden_size 5120, intermediate_size 17408,
  full_attention_interval 4, head_dim 256, dtype bfloat16, layer_types 3 linear + 1 full),
  and a transformers ``Qwen3_5Config`` of the 27B in a public repository found by code
  search (num_attention_heads 24, num_key_value_heads 4, linear_num_key_heads 16,
  linear_num_value_heads 48, linear_key_head_dim 128, linear_value_head_dim 128,
  linear_conv_kernel_dim 4, mamba_ssm_dtype float32).

They agree with each other, with the card and with the field study's numbers: 16 full
attention layers x 4 KV heads x head_dim 256 x 2 (K, V) x 2 bytes = 65,536 bytes a token.
"""

from __future__ import annotations

from typing import Any

QWEN35_27B_GEOMETRY: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "dtype": "bfloat16",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "num_hidden_layers": 64,
    "full_attention_interval": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                    "full_attention"] * 16,
    # gated attention layers
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "attn_output_gate": True,
    "partial_rotary_factor": 0.25,
    # Gated DeltaNet layers
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
}
