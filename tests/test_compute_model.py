"""The 27b-compute perf model: the geometry model's KV geometry at the 27B's compute
(hidden 5120, a 17,408-wide shared expert, 4 x 64 routed experts), no weight file, a
digest over config, tokenizer and load settings; fp8 only where the GPU has it; the
default perf model chosen from the leased GPUs' free memory (fake devices)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.host.devices import FAKE_GPUS_ENV, compute_capability, discover
from pytest_sharedkv.models import compute_model
from pytest_sharedkv.models.compute_model import (
    LOAD_FILE,
    ComputeModelRecipe,
    choose,
    config_dict,
    digest_of,
    kv_budget_bytes,
    load_flags,
    make_compute_model,
    weight_gib,
)
from pytest_sharedkv.models.geometry_model import GEOMETRY_FIELDS, GeometryModelRecipe
from pytest_sharedkv.models.geometry_model import config_dict as geometry_config
from pytest_sharedkv.perf.fixtures import choose_model


def test_the_config_has_the_27b_compute_and_the_geometry_models_kv() -> None:
    from pytest_sharedkv.models.copy_model import CopyModelRecipe

    config = config_dict(ComputeModelRecipe())
    assert config["hidden_size"] == 5120
    assert config["shared_expert_intermediate_size"] == 17408
    assert (config["num_experts"], config["moe_intermediate_size"]) == (4, 64)
    assert config["vocab_size"] == CopyModelRecipe().vocab_size == 128
    assert config["sharedkv"]["kind"] == "27b-compute"
    geometry = geometry_config(GeometryModelRecipe())
    for name in GEOMETRY_FIELDS:
        assert config[name] == geometry[name], name


def test_its_fp8_weights_are_what_vllm_measured_on_the_h200() -> None:
    """23.55 GiB reported by vLLM for the fp8 dummy load (issue 20): the estimate behind the
    KV budget is within 3% of it."""
    gib = weight_gib(config_dict(ComputeModelRecipe()), fp8=True)
    assert abs(gib / compute_model.MEASURED_FP8_WEIGHTS_GIB - 1) < 0.03, gib


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="the tokenizer is written by transformers")
    return make_compute_model(tmp_path_factory.mktemp("compute")).path


def test_the_directory_holds_no_weights_and_its_load_settings(model: Path) -> None:
    assert not list(model.glob("*.safetensors"))
    assert (model / "config.json").is_file() and (model / "sharedkv-tokenizer.json").is_file()
    load = json.loads((model / LOAD_FILE).read_text())
    assert (load["load_format"], load["quantization"]) == ("dummy", "fp8")
    assert "random" in load["weights"]


@pytest.mark.parametrize("name", ["config.json", "sharedkv-tokenizer.json", LOAD_FILE])
def test_the_digest_changes_with_each_input(model: Path, tmp_path: Path, name: str) -> None:
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(model, copy)
    assert digest_of(copy) == digest_of(model)
    data = json.loads((copy / name).read_text())
    data["changed"] = True
    (copy / name).write_text(json.dumps(data))
    assert digest_of(copy) != digest_of(model)


def test_the_digest_changes_with_the_recipe(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the tokenizer is written by transformers")
    a = make_compute_model(tmp_path / "a").digest
    b = make_compute_model(tmp_path / "b", ComputeModelRecipe(quantization="fp8-other")).digest
    assert a != b


def test_make_model_writes_it(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the tokenizer is written by transformers")
    from pytest_sharedkv.__main__ import make_model_command
    from pytest_sharedkv.models.kinds import kind_in, refusal

    assert make_model_command(["--kind", "27b-compute", str(tmp_path / "m")]) == 0
    assert kind_in(tmp_path / "m") == "27b-compute"
    assert refusal(tmp_path / "m", "27b-compute") is None
    assert refusal(tmp_path / "m", "geometry") is not None


@pytest.mark.parametrize(("capability", "quantization"), [
    (9.0, "fp8"), (8.9, "fp8"), (8.0, None), (None, None)])
def test_fp8_only_where_the_gpu_has_it(model: Path, capability: float | None,
                                       quantization: str | None) -> None:
    fmt, quant, why = load_flags(model, capability)
    assert (fmt, quant) == ("dummy", quantization)
    assert ("compute capability" in why)


def test_a_model_with_weights_gets_no_load_flags(tmp_path: Path) -> None:
    assert load_flags(tmp_path, 9.0)[:2] == (None, None)


def test_the_capability_comes_from_the_fake_spec_never_cuda() -> None:
    gpus = discover(environ={FAKE_GPUS_ENV: "0:140:9.0,1:70"}).gpus
    assert [compute_capability(g) for g in gpus] == [9.0, None]


@pytest.mark.parametrize("spec", ["0:140:x", "0:140:0.5"])
def test_a_bad_fake_capability_is_named(spec: str) -> None:
    from pytest_sharedkv.host.devices import environment_problem

    problem = environment_problem({FAKE_GPUS_ENV: spec})
    assert problem is not None and "compute capability" in problem


@pytest.mark.parametrize(("spec", "pair_gpus", "kind"), [
    ("0:140", "1", "27b-compute"),
    ("0:80", "1", "geometry"),
    ("0", "1", "geometry"),  # free memory unknown
    ("0:70,1:70", "2", "27b-compute"),
    ("0:70,1:50", "2", "geometry"),
])
def test_the_default_perf_model_from_fake_gpu_memory(spec: str, pair_gpus: str,
                                                     kind: str) -> None:
    from pytest_sharedkv.perf.fixtures import _free_gib

    gpus = discover(environ={FAKE_GPUS_ENV: spec}).gpus[:int(pair_gpus)]
    choice = choose_model(Settings(pair_gpus=pair_gpus), _free_gib(gpus))
    assert choice.kind == kind
    assert choice.why.startswith(f"{kind} model")
    assert "GiB" in choice.why


def test_no_gpu_means_the_geometry_model_and_says_why() -> None:
    kind, why = choose([], 1)
    assert kind == "geometry" and "no GPU" in why


def test_the_option_and_a_given_model_override_the_choice(tmp_path: Path) -> None:
    assert choose_model(Settings(perf_model="geometry"), [140.0]).kind == "geometry"
    assert choose_model(Settings(perf_model="27b-compute"), []).kind == "27b-compute"
    assert choose_model(Settings(model=tmp_path), [140.0]).kind == "given"


def test_the_kv_budget_of_two_replicas_on_one_h200() -> None:
    """140 GiB free, two replicas, 23.55 GiB of fp8 weights: about 35 GiB each (vLLM
    sized 36.08 GiB at --gpu-memory-utilization 0.44); none where nothing is left."""
    kv, why = kv_budget_bytes([140.0], 2, 23.55)
    assert kv is not None and 34 << 30 < kv < 37 << 30, why
    assert kv_budget_bytes([40.0], 2, 23.55)[0] is None
    assert kv_budget_bytes([], 2, 1.0)[0] is None


def test_the_perf_engine_for_the_27b_compute_model_on_a_fake_h200(model: Path) -> None:
    """CUDA graphs, --load-format dummy --quantization fp8 (capability 9.0), an explicit KV
    cache each from 140 GiB free (both replicas start together), the user's flags last;
    with the free memory unknown, vLLM's own sizing and one replica after the other."""
    from pytest_sharedkv.perf.fixtures import _free_gib, engine_for

    gpus = discover(environ={FAKE_GPUS_ENV: "0:140:9.0"}).gpus
    settings = Settings(vllm_args=("--max-num-seqs", "8"))
    engine, notes = engine_for(settings, model, gpus, _free_gib(gpus))
    flags = engine.flags()
    assert "--enforce-eager" not in flags and engine.extra_args == ("--max-num-seqs", "8")
    assert " ".join(flags).count("--load-format dummy --quantization fp8") == 1
    assert engine.kv_cache_bytes is not None and 34 << 30 < engine.kv_cache_bytes < 37 << 30
    assert any(n.startswith("start: both replicas together") for n in notes)
    # vLLM refuses to start unless this share is free: the second replica starts beside
    # the first, so one replica's share, not vLLM's default 0.9
    assert flags[flags.index("--gpu-memory-utilization") + 1] == "0.45"
    unknown = discover(environ={FAKE_GPUS_ENV: "0"}).gpus
    engine, notes = engine_for(Settings(), model, unknown, _free_gib(unknown))
    assert engine.kv_cache_bytes is None and engine.quantization is None
    assert any(n.startswith("start: one replica after the other") for n in notes)
    given = engine_for(Settings(kv_cache_gib=20.0), model, unknown, [None])[0]
    assert given.kv_cache_bytes == 20 << 30
