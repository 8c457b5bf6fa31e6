"""The physical floor: KV bytes a token and recurrent bytes a sequence from a config.json
(hybrid, plain, nested text_config), the field study's numbers, and a clear error where
there is no CUDA device to measure the host-to-device rate."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_sharedkv.models.geometry_27b import QWEN35_27B_GEOMETRY
from pytest_sharedkv.perf.floor import (
    FloorError,
    below_floor,
    config_floor,
    floor_ratio,
    invalid,
    kv_geometry,
    layer_counts,
    measure_h2d_gb_s,
)
from pytest_sharedkv.perf.observations import Floor, Observation

# 48 Gated DeltaNet layers x (state 48 x 128 x 128 in float32 + conv 3 x (2 x 16 x 128 +
# 48 x 128) in bfloat16)
RECURRENT_27B = 48 * (48 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 48 * 128) * 2)


def hybrid_like_27b() -> dict[str, Any]:
    """The issue's case: 64 layers, full attention every 4th, 4 KV heads, head_dim 256."""
    return {"num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24,
            "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 5120,
            "torch_dtype": "bfloat16", "linear_num_key_heads": 16,
            "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}


def test_the_27b_like_hybrid_matches_the_field_study() -> None:
    config = hybrid_like_27b()
    assert layer_counts(config) == (16, 48)
    kv, recurrent = kv_geometry(config)
    assert kv == 65_536  # 16 x 4 x 256 x 2 x 2 bytes
    assert recurrent == 48 * (48 * 128 * 128 * 2 + 3 * 10_240 * 2)  # all in bfloat16
    floor = Floor(h2d_gb_s=55.3, kv_bytes_per_token=kv, recurrent_bytes_per_sequence=0,
                  source="the issue's case")
    assert floor.seconds(131_072) == pytest.approx(0.155, abs=0.0005)
    assert round(floor_ratio(0.605, 131_072, floor), 1) == 3.9  # 128k: cross = 3.9x floor
    assert round(floor_ratio(0.790, 262_144, floor), 1) == 2.5  # 256k: 2.5x
    assert not below_floor(0.605, 131_072, floor) and below_floor(0.150, 131_072, floor)


def test_the_published_27b_geometry() -> None:
    assert QWEN35_27B_GEOMETRY["layer_types"].count("full_attention") == 16
    kv, recurrent = kv_geometry(QWEN35_27B_GEOMETRY)
    assert (kv, recurrent) == (65_536, RECURRENT_27B)  # mamba_ssm_dtype float32 counted
    without_layer_types = {k: v for k, v in QWEN35_27B_GEOMETRY.items() if k != "layer_types"}
    assert kv_geometry(without_layer_types) == (kv, recurrent)
    floor = config_floor(QWEN35_27B_GEOMETRY, 55.3, "config.json of Qwen3.5-27B")
    assert floor.seconds(131_072) == pytest.approx(0.158, abs=0.0005)  # + 2.8 ms of state


def test_a_plain_transformer_counts_every_layer() -> None:
    llama_like = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "hidden_size": 4096, "torch_dtype": "bfloat16"}
    assert kv_geometry(llama_like) == (32 * 8 * 128 * 2 * 2, 0)  # head_dim = 4096 / 32
    mha = {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
           "dtype": "float32"}
    assert kv_geometry(mha) == (12 * 12 * 64 * 2 * 4, 0)  # no num_key_value_heads: MHA
    assert kv_geometry(mha, dtype="float16") == (12 * 12 * 64 * 2 * 2, 0)
    sliding = {**llama_like, "layer_types": ["sliding_attention", "full_attention"] * 16}
    assert kv_geometry(sliding)[0] == 16 * 8 * 128 * 2 * 2  # a lower bound: windows not counted


def test_a_nested_text_config_is_read() -> None:
    multimodal: dict[str, Any] = {"architectures": ["Qwen3_5ForConditionalGeneration"],
                  "text_config": copy.deepcopy(QWEN35_27B_GEOMETRY),
                  "vision_config": {"depth": 27, "hidden_size": 1152}}
    assert kv_geometry(multimodal) == (65_536, RECURRENT_27B)
    del multimodal["text_config"]["dtype"]
    multimodal["torch_dtype"] = "bfloat16"  # the dtype only at the top level
    assert kv_geometry(multimodal) == (65_536, RECURRENT_27B)


@pytest.mark.parametrize(("change", "message"), [
    ({"torch_dtype": None}, "no dtype or torch_dtype"),
    ({"torch_dtype": "complex64"}, "dtype 'complex64' is not one of"),
    ({"num_hidden_layers": None}, "num_hidden_layers must be a non-negative integer"),
    ({"linear_num_value_heads": "48"}, "linear_num_value_heads must be a non-negative integer"),
    ({"full_attention_interval": 0}, "full_attention_interval must be a positive integer"),
])
def test_a_config_the_geometry_cannot_be_read_from(change: dict[str, Any],
                                                   message: str) -> None:
    config = {**hybrid_like_27b(), **change}
    with pytest.raises(FloorError, match=message) as caught:
        kv_geometry(config, where="models/x/config.json")
    assert str(caught.value).startswith("models/x/config.json: ")


def test_measuring_without_cuda_is_a_clear_error() -> None:
    try:
        import torch
    except ImportError:
        with pytest.raises(FloorError, match="needs torch"):
            measure_h2d_gb_s()
        return
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the no-CUDA error cannot show")
    with pytest.raises(FloorError, match="no CUDA device here"):
        measure_h2d_gb_s(nbytes=1024, repeats=1)
    with pytest.raises(FloorError, match="'cpu' is not a CUDA device"):
        measure_h2d_gb_s("cpu")


def test_invalid_marks_only_measured_cross_observations_below_the_floor() -> None:
    floor = Floor(55.3, 65_536, 0, "test")

    def observation(step: str, ttft: float, warmup: bool = False) -> Observation:
        return Observation("ON", 1, 0, "128k", step, "r", "sha", "B", 131_072, 16, ttft,
                           None, ttft, warmup)

    data = [observation("cross", 0.1), observation("cross", 0.6),
            observation("local", 0.05), observation("cross", 0.1, warmup=True)]
    assert invalid(data, floor) == [data[0]]
