"""The 27B-compute perf model: the geometry model's KV geometry at the dense 27B's compute,
with no weight file.

Why: the geometry model (``geometry_model``) has the 27B's KV and recurrent-state bytes
but 1/20 of its compute, so a screening on it underrates what a prefix hit saves (issue
20: "the pool pays off only at 8k" was that artifact). This model keeps the geometry and
takes the 27B's residual width (hidden 5120) and FFN: Qwen3-Next's shared expert is
17,408 wide (the 27B's dense ``intermediate_size``) and the routed experts, which vLLM's
Qwen3-Next requires, are 4 x 64 (about nothing), so an FFN costs what the dense 27B's does.

Its weights are random: vLLM serves it with ``--load-format dummy`` (no weight file is
written or read), with ``--quantization fp8`` where the GPU has fp8 (compute capability
8.9 or more), as measured on the H200: 23.55 GiB of weights, two replicas on one GPU.
Answers are noise; prefill and decode compute are real. The directory holds config.json,
the copy vocabulary's tokenizer (as the geometry model's) and ``sharedkv-load.json``, the
load settings; the digest covers all three.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KIND = "27b-compute"
RECIPE_VERSION = 1
LOAD_FILE = "sharedkv-load.json"
HIDDEN = 5120  # the 27B's residual width
DENSE_FFN = 17408  # the 27B's intermediate_size, as the shared expert's
FP8_MIN_CAPABILITY = 8.9  # Ada / Hopper and later: vLLM's fp8 linear kernels
# What a replica needs besides its weights and KV (activations, CUDA graphs, the
# allocator's slack), and the share of free memory the engines may take (vLLM's own limit
# is per process; two replicas share the GPU): measured 1.9 GiB at eager on the H200.
OVERHEAD_GIB = 4.0
USABLE_SHARE = 0.90
MEASURED_FP8_WEIGHTS_GIB = 23.55  # vLLM's report on the H200 (fp8, dummy load)
# the free GiB a replica needs to serve it with room for long prompts (issue 20: 60 GiB
# each on one H200 at --gpu-memory-utilization 0.44)
REPLICA_GIB = 60.0


@dataclass(frozen=True)
class ComputeModelRecipe:
    """What differs from the geometry model; the digest changes with any field."""

    hidden_size: int = HIDDEN
    shared_expert_size: int = DENSE_FFN
    experts: int = 4
    expert_size: int = 64
    load_format: str = "dummy"
    quantization: str = "fp8"  # applied where the GPU has fp8 (FP8_MIN_CAPABILITY)
    layers: int | None = None  # None: all 64; fewer only for quick self-tests

    def key(self) -> str:
        text = json.dumps({"kind": KIND, "v": RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_dict(recipe: ComputeModelRecipe) -> dict[str, Any]:
    """config.json: the geometry model's, at the 27B's width and FFN."""
    from pytest_sharedkv.models import geometry_model

    base = geometry_model.GeometryModelRecipe(
        hidden_size=recipe.hidden_size, experts=recipe.experts,
        expert_size=recipe.expert_size, layers=recipe.layers)
    config = geometry_model.config_dict(base)
    config["intermediate_size"] = recipe.shared_expert_size
    config["shared_expert_intermediate_size"] = recipe.shared_expert_size
    config["sharedkv"] = {"kind": KIND, "recipe_version": RECIPE_VERSION, **asdict(recipe)}
    return config


def load_settings(recipe: ComputeModelRecipe) -> dict[str, Any]:
    """What ``sharedkv-load.json`` holds: how vLLM must load a model with no weights."""
    return {"load_format": recipe.load_format, "quantization": recipe.quantization,
            "quantization_min_capability": FP8_MIN_CAPABILITY,
            "weights": "random (vLLM --load-format dummy): answers are noise, compute is "
                       "real"}


def read_load_settings(path: Path) -> dict[str, Any] | None:
    """The load settings a model directory holds, None where it holds none (a model with
    weights) or they do not parse."""
    try:
        data = json.loads((path / LOAD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_flags(path: Path, capability: float | None) -> tuple[str | None, str | None, str]:
    """(load format, quantization, why) for serving PATH on a GPU of CAPABILITY (None:
    unknown, so no fp8: an engine that cannot run fp8 fails to start)."""
    data = read_load_settings(path)
    if data is None:
        return None, None, "weights from the checkpoint"
    fmt = str(data.get("load_format") or "") or None
    quant = data.get("quantization")
    least = float(data.get("quantization_min_capability", FP8_MIN_CAPABILITY))
    if quant is None:
        return fmt, None, f"--load-format {fmt}"
    if capability is None:
        return fmt, None, (f"--load-format {fmt}, no --quantization {quant}: the GPU's "
                           "compute capability is unknown")
    if capability < least:
        return fmt, None, (f"--load-format {fmt}, no --quantization {quant}: compute "
                           f"capability {capability:g} < {least:g}")
    return fmt, str(quant), (f"--load-format {fmt} --quantization {quant} (compute "
                             f"capability {capability:g})")


def digest_of(path: Path) -> str:
    """sha256 over config.json, the canonical tokenizer spec and the load settings (16 hex)."""
    parts = [path / "config.json", path / "sharedkv-tokenizer.json", path / LOAD_FILE]
    joined = "".join(hashlib.sha256(p.read_bytes()).hexdigest() for p in parts)
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def weight_gib(config: dict[str, Any], fp8: bool) -> float:
    """GiB of weights vLLM holds: bf16, or fp8 matrices (embedding, head and norms stay
    bf16) where FP8; the H200's measured figure where it is the full model in fp8."""
    from pytest_sharedkv.models.geometry_model import shapes

    total = 0
    for name, shape in shapes(config).items():
        n = 1
        for d in shape:
            n *= d
        matrix = len(shape) == 2 and "embed_tokens" not in name and "lm_head" not in name \
            and not name.endswith("gate.weight")
        total += n * (1 if fp8 and matrix else 2)
    return total / (1 << 30)


def kv_budget_bytes(free_gib: Sequence[float], replicas_per_gpu: int, weights_gib: float
                    ) -> tuple[int | None, str]:
    """(--kv-cache-memory-bytes per replica, why): the least free GPU's share, less the
    weights and an overhead; None (and why) where that leaves no room."""
    if not free_gib:
        return None, "no GPU memory reading"
    share = min(free_gib) * USABLE_SHARE / replicas_per_gpu
    kv = share - weights_gib - OVERHEAD_GIB
    how = (f"{min(free_gib):.1f} GiB free x {USABLE_SHARE:g} / {replicas_per_gpu} "
           f"replica(s) - {weights_gib:.2f} GiB weights - {OVERHEAD_GIB:g} GiB overhead")
    if kv < 1.0:
        return None, f"no room for a KV cache ({how} = {kv:.1f} GiB)"
    # whole GiB: the budget is in the argv, and two runs' flags must agree to be compared
    # or merged; a few MiB more or less free must not change them
    whole = math.floor(kv)
    return whole << 30, f"{whole} GiB each ({how} = {kv:.2f}, rounded down)"


def choose(free_gib: Sequence[float | None], pair_gpus: int) -> tuple[str, str]:
    """(perf model, why): 27b-compute where the GPU(s) hold two replicas of it (about
    REPLICA_GIB free for each), else the geometry model."""
    known = [f for f in free_gib if f is not None]
    need = f"{REPLICA_GIB:g} GiB free for each replica"
    if not free_gib:
        return "geometry", f"geometry model: no GPU visible to hold the 27b-compute model ({need})"
    if len(known) < len(free_gib):
        return "geometry", f"geometry model: the GPU's free memory is unknown ({need})"
    if pair_gpus == 2:
        if len(known) >= 2 and min(known[:2]) >= REPLICA_GIB:
            return KIND, (f"27b-compute model: {known[0]:.0f} and {known[1]:.0f} GiB free, "
                          f"one replica each ({need})")
        return "geometry", (f"geometry model: {', '.join(f'{f:.0f}' for f in known[:2])} "
                            f"GiB free on the pair's GPUs, under {need} for the 27b-compute "
                            "model")
    if known[0] >= 2 * REPLICA_GIB:
        return KIND, f"27b-compute model: {known[0]:.0f} GiB free on one GPU ({need})"
    return "geometry", (f"geometry model: {known[0]:.0f} GiB free on the GPU, under "
                        f"{2 * REPLICA_GIB:g} GiB for two replicas of the 27b-compute model "
                        f"(or --sharedkv-pair-gpus 2)")


@dataclass(frozen=True)
class ComputeModelCard:
    path: Path
    recipe: ComputeModelRecipe
    digest: str

    def describe(self) -> str:
        return (f"27b-compute model {self.path.name} (digest {self.digest}, random weights "
                f"served with --load-format {self.recipe.load_format})")


def make_compute_model(dst: Path, recipe: ComputeModelRecipe | None = None
                       ) -> ComputeModelCard:
    """Write the model to DST: config.json, tokenizer files, the load settings (last: a
    directory with them is complete)."""
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, write_model_dir

    recipe = recipe or ComputeModelRecipe()
    config = config_dict(recipe)
    words = CopyModelRecipe(max_position_embeddings=int(config["max_position_embeddings"]))
    write_model_dir(dst, config, None, words)
    (dst / LOAD_FILE).write_text(json.dumps(load_settings(recipe), indent=1, sort_keys=True))
    return ComputeModelCard(dst, recipe, digest_of(dst))


def is_compute_model(path: Path) -> bool:
    from pytest_sharedkv.models.copy_model import model_kind

    return model_kind(path) == KIND
