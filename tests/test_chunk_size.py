"""One chunk-size rule: --sharedkv-chunk-size's default is two engine blocks of the model
(a hybrid model's raised block, vLLM's default 16 for attention-only ones), and the
``blocks`` argument is honoured for every model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.layouts.chunk_size import (
    DEFAULT_CHUNK,
    chunk_size_for_config,
    derive_chunk_size,
)
from pytest_sharedkv.models.config_file import ModelConfigError
from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict

LLAMA = {"architectures": ["LlamaForCausalLM"], "num_key_value_heads": 8, "head_dim": 128}


def test_attention_only_models_get_two_default_blocks() -> None:
    assert chunk_size_for_config(LLAMA) == 2 * 16 == DEFAULT_CHUNK
    assert chunk_size_for_config(LLAMA, blocks=4) == 64  # blocks is not ignored


def test_hybrid_models_get_blocks_of_their_raised_block() -> None:
    config = config_dict(CopyModelRecipe())
    one = chunk_size_for_config(config, blocks=1)
    assert chunk_size_for_config(config) == 2 * one == 32  # the copy corpus's chunk
    assert chunk_size_for_config(config, blocks=3) == 3 * one


def test_the_option_help_says_what_the_code_does() -> None:
    from pytest_sharedkv.config.options import OPTIONS

    option = next(o for o in OPTIONS if o.name == "chunk-size")
    assert "two engine blocks" in option.help and "16" in option.help


def test_an_unreadable_config_is_one_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config\.json: cannot be read as JSON"):
        derive_chunk_size(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert derive_chunk_size(tmp_path) == 32
