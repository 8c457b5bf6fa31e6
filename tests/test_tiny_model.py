"""The tiny hybrid model: offline, deterministic from its seed, servable shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the generator writes a transformers checkpoint")


def test_make_model_is_deterministic_and_hybrid(tmp_path: Path) -> None:
    from pytest_sharedkv.models.tiny_model import TinyModelRecipe, make_model

    first = make_model(tmp_path / "a")
    second = make_model(tmp_path / "b")
    assert first.digest == second.digest
    other = make_model(tmp_path / "c", TinyModelRecipe(seed=1))
    assert other.weights_sha256 != first.weights_sha256
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["num_experts"] == 4  # vLLM's Qwen3Next needs an MoE layer
    assert (tmp_path / "a" / "tokenizer.json").exists()


def test_greedy_continuation_is_reproducible(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pytest_sharedkv.models.tiny_model import make_model, synthetic_corpus

    path = make_model(tmp_path / "m").path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    prompt = " ".join(synthetic_corpus(7, 30))
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert ids.shape[1] > 160  # several LMCache chunks of 160 tokens
    with torch.no_grad():
        one = model.generate(ids, max_new_tokens=8, do_sample=False)[0, -8:].tolist()
        two = model.generate(ids, max_new_tokens=8, do_sample=False)[0, -8:].tolist()
    assert one == two


def test_cli(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pytest_sharedkv", "make-model",
                          str(tmp_path / "m")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "digest" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "pytest_sharedkv", "make-model",
                          "/proc/sharedkv-cannot-write"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2
    assert "make-model: cannot write /proc/sharedkv-cannot-write" in bad.stderr
