"""The geometry model: the 27B's KV geometry (65,536 bytes a token), weights under 1 GB,
a digest that depends only on the recipe, and a checkpoint transformers loads and runs.

Files are written for a 4-layer cut of the model (the 64-layer one is the same layers,
16 times; writing its 0.76 GB takes ~8 s): its per-layer shapes are the full model's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.models.geometry_27b import QWEN35_27B_GEOMETRY
from pytest_sharedkv.models.geometry_model import (
    GEOMETRY_FIELDS,
    GeometryModelRecipe,
    config_dict,
    shapes,
    weight_bytes,
)
from pytest_sharedkv.perf.floor import kv_geometry

pytest.importorskip("safetensors", reason="the generator writes safetensors")
pytest.importorskip("torch", reason="the generator draws weights with torch")
CUT = GeometryModelRecipe(layers=4)


@pytest.fixture(scope="module")
def cut_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_sharedkv.models.geometry_model import make_geometry_model

    return make_geometry_model(tmp_path_factory.mktemp("geometry"), CUT).path


def test_the_config_has_the_27b_geometry() -> None:
    config = config_dict(GeometryModelRecipe())
    for name in GEOMETRY_FIELDS:
        assert config[name] == QWEN35_27B_GEOMETRY[name], name
    assert config["layer_types"].count("full_attention") == 16
    assert config["layer_types"].count("linear_attention") == 48
    assert config["max_position_embeddings"] >= 262_144
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    kv, recurrent = kv_geometry(config)
    assert kv == 65_536  # 16 layers x 4 KV heads x 256 x (K, V) x 2 bytes
    assert (kv, recurrent) == kv_geometry({**QWEN35_27B_GEOMETRY, "dtype": "bfloat16"})


def test_the_weights_stay_small() -> None:
    full = weight_bytes(config_dict(GeometryModelRecipe()))
    assert 0.5e9 < full < 1e9  # 0.76 GB of bf16 (the 27B's are ~54 GB)
    assert weight_bytes(config_dict(CUT)) < full / 10


def test_a_cut_must_keep_the_layer_pattern() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        config_dict(GeometryModelRecipe(layers=6))


def test_the_digest_depends_only_on_the_recipe(cut_dir: Path, tmp_path: Path) -> None:
    from pytest_sharedkv.models.geometry_model import (
        digest_of,
        is_geometry_model,
        make_geometry_model,
    )

    again = make_geometry_model(tmp_path / "again", CUT)
    assert again.digest == digest_of(cut_dir)
    assert make_geometry_model(tmp_path / "seed1", GeometryModelRecipe(layers=4, seed=1)
                               ).digest != again.digest
    assert is_geometry_model(cut_dir)
    weights = (cut_dir / "model.safetensors").stat().st_size
    assert 0 < weights - weight_bytes(config_dict(CUT)) < 1 << 20  # the header only
    config = json.loads((cut_dir / "config.json").read_text())
    assert config["sharedkv"]["kind"] == "geometry"


def test_transformers_loads_it_and_runs_8_tokens(cut_dir: Path) -> None:
    pytest.importorskip("transformers", reason="the smoke test loads it with transformers")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded: Any = AutoModelForCausalLM.from_pretrained(cut_dir, dtype=torch.bfloat16,
                                                       output_loading_info=True)
    model, info = loaded
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    state = model.state_dict()
    for name, shape in shapes(config_dict(CUT)).items():
        if name in state:  # transformers may fuse the experts in memory
            assert tuple(state[name].shape) == shape, name
    ids = AutoTokenizer.from_pretrained(cut_dir)("w01 w02 w03 w04 w05 w06 w07",
                                                return_tensors="pt").input_ids
    assert ids.shape == (1, 8)  # <s> and one token a word
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 8, 128) and bool(torch.isfinite(logits.float()).all())


def test_make_model_writes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    import functools

    from pytest_sharedkv import __main__
    from pytest_sharedkv.models import geometry_model
    monkeypatch.setattr(geometry_model, "GeometryModelRecipe",
                        functools.partial(GeometryModelRecipe, layers=4))
    assert __main__.make_model_command(["--kind", "geometry", str(tmp_path / "m")]) == 0
    digest = geometry_model.digest_of(tmp_path / "m")
    assert capsys.readouterr().out == f"{tmp_path / 'm'}: geometry model, digest {digest}\n"
