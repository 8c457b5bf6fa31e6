"""The perf tier's pytest side: which replica provider a screening runs on (with the GPU
and package needs of a launched pair as markers, so an unmet need is a precise skip), the
model it serves, and the block runner, ready to run. Every name is ``sharedkv_*``;
``sharedkv_perf_provider`` is parametrized only for tests of the perf tier. Imports stay
light: this module loads with the plugin in every pytest run."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.config.provider import Provider, Resolved
from pytest_sharedkv.config.tiers import parametrizes
from pytest_sharedkv.report.fields import PERF_PROPERTY
from pytest_sharedkv.report.progress import progress_logger
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.perf.blocks import BlockRunner
    from pytest_sharedkv.perf.observations import Floor, PerfRun
    from pytest_sharedkv.perf.payloads import PayloadSet
    from pytest_sharedkv.report.terminal import TierReport
    from pytest_sharedkv.stack.pair import ReplicaPair

TIER = "perf"
PROVIDER = "sharedkv_perf_provider"
DEFAULT_SIZES = ("8k", "32k")
STUB_PREFILL_US = 10.0  # the stub's simulated prefill per uncached prompt token
STUB_CHUNK = 64  # tokens per stub block: fewer pool files per prompt
VLLM_MAX_TOKENS = 16  # answer length on launched vLLM: decode rate from 15 intervals


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not parametrizes(metafunc, PROVIDER, TIER):
        return
    from pytest_sharedkv.stack.fixtures import provider_marks, resolve_provider

    settings = state_of(metafunc.config).settings
    provider = resolve_provider(settings)
    metafunc.parametrize(PROVIDER, [pytest.param(
        provider, marks=provider_marks(provider, int(settings.pair_gpus)), id=provider.name)])


def perf_sizes(settings: Settings) -> tuple[str, ...]:
    """--sharedkv-service-sizes where given, else 8k and 32k."""
    return settings.service_sizes or DEFAULT_SIZES


@pytest.fixture(scope="session")
def sharedkv_perf_model_dir(pytestconfig: pytest.Config,
                            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """--sharedkv-model, or the geometry model (the 27B's KV geometry, small weights)
    generated once per run (xdist-safe)."""
    from pytest_sharedkv.stack.fixtures import model_dir

    def maker() -> tuple[str, Callable[[Path], object]]:
        from pytest_sharedkv.models.geometry_model import (
            GeometryModelRecipe,
            make_geometry_model,
        )

        recipe = GeometryModelRecipe()
        return recipe.key(), lambda path: make_geometry_model(path, recipe)

    return model_dir(pytestconfig, tmp_path_factory, "geometry", maker)


def _uses_copy_words(model: Path) -> bool:
    """The copy model and the geometry model speak the copy vocabulary (so does the stub)."""
    from pytest_sharedkv.models.copy_model import is_copy_model
    from pytest_sharedkv.models.geometry_model import is_geometry_model

    return is_copy_model(model) or is_geometry_model(model)


def _context(model: Path | None) -> int:
    from pytest_sharedkv.models.config_file import max_position_embeddings

    return max_position_embeddings(model, 131_072) if model is not None else 1 << 30


def _payloads(settings: Settings, words: bool, model: Path | None, chunk: int,
              max_tokens: int) -> PayloadSet:
    from pytest_sharedkv.perf import payloads
    generate = payloads.word_generator(chunk) if words else payloads.text_generator(model)
    return payloads.build(payloads.WORDS if words else payloads.TEXT, perf_sizes(settings),
                          chunk, generate, limit=_context(model) - max_tokens - 16)


def _versions(provider: str, gpu: str) -> dict[str, str]:
    from importlib import metadata

    engine = {"provider": provider}
    for name in ("vllm", "lmcache", "torch"):
        try:
            engine[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            engine[name] = "not installed"
    engine["gpu"] = gpu
    return engine


def _gpu_name(item: pytest.Item) -> str:
    from pytest_sharedkv.config.gating import ITEM_LEASE
    lease = item.stash.get(ITEM_LEASE, None)
    if lease is None or not lease.gpus:
        return "none"
    return ", ".join(g.name for g in lease.gpus)


def _model_digest(model: Path) -> str:
    import hashlib

    from pytest_sharedkv.models.copy_model import digest_of

    if _uses_copy_words(model):  # written by the suite: config, weights, tokenizer spec
        return digest_of(model)
    config = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()[:16]
    return f"{config} (config.json only)"


def _floor(model: Path) -> tuple[Floor | None, str]:
    """The physical floor on this GPU: H2D measured now, geometry from config.json."""
    from pytest_sharedkv.models.config_file import ModelConfigError, read_config
    from pytest_sharedkv.perf.floor import FloorError, config_floor, measure_h2d_gb_s

    try:
        rate = measure_h2d_gb_s()
        config = read_config(model)
        floor = config_floor(config, rate, f"config.json of {model.name}; host-to-device "
                             "rate measured in this run (pinned, 1 GiB, median of 5)")
    except (FloorError, ModelConfigError) as exc:
        return None, f"no floor: {exc}"
    finally:  # the engines about to start share this GPU: give back the copy buffers
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    from pytest_sharedkv.perf.pool_size import stored_bytes_per_token

    stored = stored_bytes_per_token(config)
    layout = (f"; the pool stores {stored:,} bytes a token as the engine lays the KV out "
              f"({stored / floor.kv_bytes_per_token:.1f}x), so a full hit moves that much"
              if stored != floor.kv_bytes_per_token else "")
    return floor, (f"floor: {floor.kv_bytes_per_token:,} KV bytes a token, "
                   f"{floor.recurrent_bytes_per_sequence:,} recurrent bytes a sequence, "
                   f"{floor.h2d_gb_s:.1f} GB/s host-to-device{layout}")


@dataclass
class _Setup:
    """What differs between providers: how a pair comes to exist in an arm, and what the
    screening can say about it."""

    launch: Callable[[str], ReplicaPair]
    arms: tuple[str, ...]
    chunk: int
    digest: str
    chunk_known: bool = True  # False: a guess (external endpoints), not recorded as fact
    words: bool = True  # payloads in the copy vocabulary (their token counts are known)
    model: Path | None = None
    max_tokens: int = 32
    max_model_len: int = 4096
    l1_size_gb: float = 8.0  # the ON arm's pool; vllm: sized to the payloads (pool_size_gb)
    settle_s: float = 0.5
    store_s_per_token: float | None = None  # None: LMCache's store time (blocks.py)
    extra: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    floor: Floor | None = None
    notes: list[str] = field(default_factory=list)


def _stub_setup(settings: Settings, arms: tuple[str, ...],
                tmp_path_factory: pytest.TempPathFactory) -> _Setup:
    from pytest_sharedkv.stack.providers import LaunchSpec, stub_pair

    chunk = settings.chunk_size or STUB_CHUNK

    def launch(arm: str) -> ReplicaPair:
        return stub_pair(LaunchSpec(log_dir=tmp_path_factory.mktemp(f"perf-stub-{arm}"),
                                    chunk_size=chunk, arm=arm,
                                    stub_prefill_us=STUB_PREFILL_US))

    return _Setup(launch, arms, chunk, "stub (test double)", max_tokens=8, settle_s=0.0,
                  store_s_per_token=0.0,  # the stub stores synchronously
                  notes=["TEST DOUBLE: the stub provider has no GPU and no KV; its timings "
                         "exercise the tier's machinery and say nothing about a KV stack",
                         "no floor: the stub provider is a test double (no GPU, no KV to "
                         "move)"])


def _external_setup(settings: Settings) -> _Setup:
    from pytest_sharedkv.layouts.chunk_size import derive_chunk_size
    from pytest_sharedkv.stack.providers import external_pair

    endpoints = settings.endpoints or ()
    pair = external_pair(endpoints)
    return _Setup(lambda arm: pair, ("ON",),
                  settings.chunk_size or derive_chunk_size(settings.model),
                  f"external {', '.join(endpoints)}", model=settings.model, extra={},
                  chunk_known=settings.chunk_size is not None,
                  words=settings.model is not None and _uses_copy_words(settings.model),
                  notes=["external endpoints: one block as deployed (recorded as ON); OFF and"
                         " ON blocks need restarts, which the suite cannot do to a deployment",
                         "no floor: external endpoints (no GPU of theirs to measure here)"])


def _vllm_setup(settings: Settings, arms: tuple[str, ...], model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> _Setup:
    from pytest_sharedkv.layouts.chunk_size import derive_chunk_size
    from pytest_sharedkv.models.geometry_model import is_geometry_model
    from pytest_sharedkv.stack.providers import (
        LaunchSpec,
        launch_vllm_pair,
    )

    chunk = settings.chunk_size or derive_chunk_size(model)
    from pytest_sharedkv.host.devices import visible_tokens

    devices = visible_tokens()
    log_root = tmp_path_factory.mktemp("perf-vllm")

    def launch(arm: str) -> ReplicaPair:  # ON: the validated (mixed) allocator; no gate hook
        return launch_vllm_pair(LaunchSpec(
            log_dir=log_root / f"{arm}-{time.monotonic_ns()}", allocator="mixed", model=model,
            devices=devices, arm=arm, gate=False, chunk_size=chunk,
            max_model_len=setup.max_model_len,  # these two are set once the payloads
            l1_size_gb=setup.l1_size_gb))  # are known

    # 16 tokens: 15 decode intervals a request; on the H200 a 64-layer engine in eager mode
    # spent 293 s on the first OFF block of 124 requests at 32 (Triton JIT included)
    setup = _Setup(launch, arms, chunk, _model_digest(model), words=_uses_copy_words(model),
                   model=model, max_tokens=VLLM_MAX_TOKENS)
    setup.floor, line = _floor(model)
    setup.notes.append(line)
    if is_geometry_model(model):
        setup.notes.append("geometry model: the 27B's KV and recurrent-state bytes with small "
                           "projections and experts, so its prefill compute is cheaper than "
                           "the real model's")
    return setup


@pytest.fixture
def sharedkv_perf_screening(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                            sharedkv_perf_provider: Resolved,
                            tmp_path_factory: pytest.TempPathFactory) -> BlockRunner:
    """The block runner for this run's provider: launched vLLM (OFF: prefix caching alone;
    ON: LMCache's MP connector, mixed allocator), the stub double (OFF: no shared pool), or
    external endpoints (one block as deployed). ``.run()`` gives the PerfRun."""
    from pytest_sharedkv.perf.blocks import BlockRunner, Plan, block_arms
    from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
    from pytest_sharedkv.stack.namespaces import Namespaces, run_id

    settings = state_of(pytestconfig).settings
    resolved = sharedkv_perf_provider
    no_pair = resolved.serves_no_pair()
    if no_pair is not None:
        pytest.skip(no_pair + (" (or --sharedkv-provider stub to exercise the perf tier on "
                               "its test double)" if resolved.missing else ""))
    provider = resolved.provider
    arms = block_arms(settings.blocks, native=settings.native_arm)
    if provider is Provider.STUB:
        setup = _stub_setup(settings, arms, tmp_path_factory)
    elif provider is Provider.EXTERNAL:
        setup = _external_setup(settings)
    else:
        model = request.getfixturevalue("sharedkv_perf_model_dir")
        setup = _vllm_setup(settings, arms, model, tmp_path_factory)
    payload_set = _payloads(settings, setup.words, setup.model, setup.chunk,
                            setup.max_tokens)
    setup.max_model_len = min(_context(setup.model), _longest(payload_set) + setup.max_tokens
                              + 64)
    if provider is Provider.VLLM and setup.model is not None:
        setup.l1_size_gb, why = _pool_size(setup.model, payload_set)
        setup.notes.append(f"pool: {setup.l1_size_gb:g} GB of LMCache L1 in the ON arm ({why})"
                           + (f"; the NATIVE arm offloads to {setup.l1_size_gb:g} GB on each "
                              "replica (vLLM's own, not shared)" if "NATIVE" in setup.arms
                              else ""))
    settle, per_token = setup.settle_s, setup.store_s_per_token
    if settings.settle_s is not None:
        settle, per_token = settings.settle_s, 0.0  # given: the whole wait
    plan = Plan(arms=setup.arms, provider=provider.value, max_tokens=setup.max_tokens,
                settle_s=settle, extra=setup.extra, restartable=provider is not Provider.EXTERNAL,
                store_s_per_token=STORE_S_PER_TOKEN if per_token is None else per_token)
    engine = _versions(provider.value if provider is not Provider.STUB else "stub (test double)",
                       _gpu_name(request.node))
    log = progress_logger(pytestconfig, "perf")
    log(f"perf screening on {provider}: blocks {'-'.join(setup.arms)}, sizes "
        f"{', '.join(payload_set.sizes())}; payloads {payload_set.source} "
        f"(digest {payload_set.digest})")
    namespaces = Namespaces(run_id(pytestconfig), request.node.nodeid)
    return BlockRunner(setup.launch, payload_set, plan, lambda key: namespaces(key).salt,
                       model_digest=setup.digest, engine=engine, floor=setup.floor,
                       notes=setup.notes, log=log,
                       chunk_tokens=setup.chunk if setup.chunk_known else None)


def _pool_size(model: Path, payload_set: PayloadSet) -> tuple[float, str]:
    """The ON arm's pool for these payloads (pool_size.pool_size_gb)."""
    from pytest_sharedkv.corpus.cases import prompt_size
    from pytest_sharedkv.models.config_file import ModelConfigError, read_config
    from pytest_sharedkv.perf.pool_size import MINIMUM_GB, pool_size_gb

    try:
        config = read_config(model)
    except ModelConfigError as exc:
        return MINIMUM_GB, f"no config.json to size it from ({exc}): the minimum"
    tokens = {size: sum(prompt_size(p.prompt_tokens, p.text)
                        for p in payload_set.of_size(size)) for size in payload_set.sizes()}
    return pool_size_gb(config, tokens)


def _longest(payload_set: PayloadSet) -> int:
    counts = [p.prompt_tokens or 0 for p in (*payload_set.requests, *payload_set.warmups)]
    counts += [t.prompt_tokens or 0 for s in payload_set.sessions for t in s.turns]
    return max([4096, *counts])


def attach_run(item: pytest.Item, run: PerfRun) -> None:
    """Put RUN on the test's reports, for the process that writes the JSON report (the
    xdist controller serialises user_properties as plain data)."""
    from pytest_sharedkv.perf.observations import to_json

    item.user_properties.append((PERF_PROPERTY, to_json(run)))


def pytest_sharedkv_tier_report() -> TierReport:
    """The perf tier's part of the terminal summary."""
    from pytest_sharedkv.perf import summary
    from pytest_sharedkv.report.terminal import TierReport

    return TierReport("perf", lines=summary.summary_lines)
