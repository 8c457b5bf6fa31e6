"""The perf tier's pytest side: which replica provider a screening runs on (with the GPU
and package needs of a launched pair as markers, so an unmet need is a precise skip), the
model it serves, and the block runner, ready to run. Every name is ``sharedkv_*``;
``sharedkv_perf_provider`` is parametrized only for tests of the perf tier. Imports stay
light: this module loads with the plugin in every pytest run."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.options import PERF_DEFAULT_SIZES, Settings
from pytest_sharedkv.config.provider import Provider, Resolved
from pytest_sharedkv.config.tiers import parametrizes
from pytest_sharedkv.report.fields import ITEM_PERF, PERF_ATTRIBUTE, PERF_PROPERTY
from pytest_sharedkv.report.progress import progress_logger
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.host.devices import Gpu
    from pytest_sharedkv.perf.blocks import BlockRunner
    from pytest_sharedkv.perf.observations import Floor, PerfRun
    from pytest_sharedkv.perf.payloads import PayloadSet
    from pytest_sharedkv.perf.pool_size import PoolSize
    from pytest_sharedkv.report.terminal import TierReport
    from pytest_sharedkv.stack.engine_settings import EngineSettings
    from pytest_sharedkv.stack.faults import StubFaults
    from pytest_sharedkv.stack.l2.backends import L2
    from pytest_sharedkv.stack.pair import ReplicaPair
    from pytest_sharedkv.stack.topology import HostsSpec

TIER = "perf"
PROVIDER = "sharedkv_perf_provider"
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
        provider, marks=provider_marks(provider, settings.pair_gpu_count), id=provider.name)])


def perf_sizes(settings: Settings) -> tuple[str, ...]:
    """--sharedkv-perf-sizes where given, else --sharedkv-service-sizes (so a command that
    chose the perf sizes with it before still runs the same), else 8k and 32k."""
    return settings.perf_sizes or settings.service_sizes or PERF_DEFAULT_SIZES


@dataclass(frozen=True)
class ModelChoice:
    """The perf model a screening serves and why: "given" (--sharedkv-model), or a
    generated kind ("geometry", "27b-compute") named by --sharedkv-perf-model or chosen
    from the GPU memory the pair has."""

    kind: str
    why: str


def choose_model(settings: Settings, free_gib: Sequence[float | None]) -> ModelChoice:
    """--sharedkv-model, else --sharedkv-perf-model, else 27b-compute where FREE_GIB (the
    leased GPUs' free memory) holds two replicas of it, else the geometry model."""
    if settings.model is not None:
        return ModelChoice("given", f"{settings.source_of('model')} {settings.model}")
    if settings.perf_model is not None:
        return ModelChoice(settings.perf_model,
                           f"{settings.perf_model} model: {settings.source_of('perf_model')}")
    from pytest_sharedkv.models.compute_model import choose

    kind, why = choose(free_gib, settings.pair_gpu_count)
    return ModelChoice(kind, why)


def perf_model_dir(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory,
                   kind: str) -> Path:
    """--sharedkv-model, or the generated KIND model, written once per run (xdist-safe)."""
    from pytest_sharedkv.stack.fixtures import model_dir

    if kind == "27b-compute":
        def compute() -> tuple[str, Callable[[Path], object]]:
            from pytest_sharedkv.models.compute_model import (
                ComputeModelRecipe,
                make_compute_model,
            )

            recipe = ComputeModelRecipe()
            return recipe.key(), lambda path: make_compute_model(path, recipe)

        from pytest_sharedkv.models.compute_model import LOAD_FILE

        return model_dir(pytestconfig, tmp_path_factory, kind, compute, done=LOAD_FILE)

    def maker() -> tuple[str, Callable[[Path], object]]:
        from pytest_sharedkv.models.geometry_model import (
            GeometryModelRecipe,
            make_geometry_model,
        )

        recipe = GeometryModelRecipe()
        return recipe.key(), lambda path: make_geometry_model(path, recipe)

    return model_dir(pytestconfig, tmp_path_factory, "geometry", maker)


@pytest.fixture(scope="session")
def sharedkv_perf_model_dir(pytestconfig: pytest.Config,
                            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """--sharedkv-model, or the model --sharedkv-perf-model names (default here, with no
    GPU reading: the geometry model), generated once per run (xdist-safe)."""
    settings = state_of(pytestconfig).settings
    return perf_model_dir(pytestconfig, tmp_path_factory, settings.perf_model or "geometry")


def _uses_copy_words(model: Path) -> bool:
    """The copy, geometry and 27b-compute models speak the copy vocabulary (so does the
    stub); prompt ids stay below its 128 words (vLLM answers 400 to ids beyond)."""
    from pytest_sharedkv.models.compute_model import is_compute_model
    from pytest_sharedkv.models.copy_model import is_copy_model
    from pytest_sharedkv.models.geometry_model import is_geometry_model

    return is_copy_model(model) or is_geometry_model(model) or is_compute_model(model)


def _context(model: Path | None) -> int:
    from pytest_sharedkv.models.config_file import max_position_embeddings

    return max_position_embeddings(model, 131_072) if model is not None else 1 << 30


def _payloads(settings: Settings, words: bool, model: Path | None, chunk: int,
              max_tokens: int, without: Sequence[str] = ()) -> PayloadSet:
    """The screening's payloads at its sizes (perf_sizes), less the sizes WITHOUT."""
    from pytest_sharedkv.perf import payloads
    generate = payloads.word_generator(chunk) if words else payloads.text_generator(model)
    sizes = [s for s in perf_sizes(settings) if s not in without]
    return payloads.build(payloads.WORDS if words else payloads.TEXT, sizes,
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


def _leased(item: pytest.Item) -> tuple[Gpu, ...]:
    from pytest_sharedkv.config.gating import ITEM_LEASE
    lease = item.stash.get(ITEM_LEASE, None)
    return () if lease is None else tuple(lease.gpus)


def _gpu_name(item: pytest.Item) -> str:
    gpus = _leased(item)
    return ", ".join(g.name for g in gpus) if gpus else "none"


def _free_gib(gpus: Sequence[Gpu]) -> list[float | None]:
    """Each leased GPU's free memory now (nvidia-smi; fake devices: their spec)."""
    from pytest_sharedkv.host.devices import Discovery, free_gib

    return [free_gib(g, Discovery((g,), source="lease", fake=g.fake)) for g in gpus]


def _model_digest(model: Path) -> str:
    import hashlib

    from pytest_sharedkv.models.compute_model import digest_of as compute_digest
    from pytest_sharedkv.models.compute_model import is_compute_model
    from pytest_sharedkv.models.copy_model import digest_of

    if is_compute_model(model):  # config, tokenizer spec, load settings (no weights)
        return compute_digest(model)
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
    layout = ""
    if stored != floor.kv_bytes_per_token:
        floor = replace(floor, stored_bytes_per_token=stored)
        layout = (f"; the pool stores {stored:,} bytes a token as the engine lays the KV out "
                  f"({stored / floor.kv_bytes_per_token:.1f}x), so a full hit moves that "
                  "much (the layout floor)")
    return floor, (f"floor: {floor.kv_bytes_per_token:,} KV bytes a token, "
                   f"{floor.recurrent_bytes_per_sequence:,} recurrent bytes a sequence, "
                   f"{floor.h2d_gb_s:.1f} GB/s host-to-device{layout}")


def _l2_floor(floor: Floor | None, l2: L2) -> tuple[Floor | None, str]:
    """The HOSTS arm's L2 floor beside the H2D floor: the L2's read rate measured now (an
    entry written and read back through the suite's own client, as floor.py times the
    host-to-device copy), over the bytes a token the pool stores."""
    from pytest_sharedkv.perf.floor import FloorError, measure_l2_read_gb_s

    if floor is None:
        return None, "no L2 floor: no floor (the bytes a token are unknown)"
    try:
        rate = measure_l2_read_gb_s(l2)
    except FloorError as exc:
        return floor, f"no L2 floor: {exc}"
    floor = replace(floor, l2_gb_s=rate)
    return floor, (f"L2 floor (HOSTS arm): {floor.stored_or_kv_bytes_per_token:,} bytes a "
                   f"token at {rate:.2f} GB/s, the read rate of {l2.describe()} measured in "
                   "this run (one 256 MiB entry written and read back by the suite's own "
                   "client, median of 3: not LMCache's reads)")


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
    one_by_one: tuple[str, ...] = ()  # sizes run request by request (the pool holds one)
    native_gb: float = 8.0  # the NATIVE arm's offload on each replica
    hosts_gb: float = 8.0  # the HOSTS arm's L1 on each of its two servers
    settle_s: float = 0.5
    store_s_per_token: float | None = None  # None: LMCache's store time (blocks.py)
    extra: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    floor: Floor | None = None
    notes: list[str] = field(default_factory=list)
    model_record: dict[str, str] = field(default_factory=dict)


def launch_arm(arm: str) -> str:
    """The launch arm of a perf arm: HOSTS launches the pool (ON) in the hosts topology."""
    return "ON" if arm == "HOSTS" else arm


def _stub_setup(settings: Settings, arms: tuple[str, ...],
                tmp_path_factory: pytest.TempPathFactory, faults: StubFaults,
                hosts: HostsSpec | None = None) -> _Setup:
    from pytest_sharedkv.stack.engine_settings import PERF_ENGINE
    from pytest_sharedkv.stack.launch.providers import stub_pair
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    chunk = settings.chunk_size or STUB_CHUNK
    # recorded as a vllm pair's would be (the stub runs none of it): the flags' path
    engine = replace(PERF_ENGINE, extra_args=settings.vllm_args)

    def launch(arm: str) -> ReplicaPair:
        return stub_pair(LaunchSpec(log_dir=tmp_path_factory.mktemp(f"perf-stub-{arm}"),
                                    chunk_size=chunk, arm=launch_arm(arm), engine=engine,
                                    stub_prefill_us=STUB_PREFILL_US, stub_faults=faults,
                                    hosts=hosts if arm == "HOSTS" else None))

    return _Setup(launch, arms, chunk, "stub (test double)", max_tokens=8, settle_s=0.0,
                  store_s_per_token=0.0,  # the stub stores synchronously
                  model_record={"kind": "stub (test double)", "weights": "none",
                                "compute": "none (simulated prefill)",
                                "why": "--sharedkv-provider stub"},
                  notes=["TEST DOUBLE: the stub provider has no GPU and no KV; its timings "
                         "exercise the tier's machinery and say nothing about a KV stack",
                         "no floor: the stub provider is a test double (no GPU, no KV to "
                         "move)"])


def _external_setup(settings: Settings) -> _Setup:
    from pytest_sharedkv.layouts.chunk_size import derive_chunk_size
    from pytest_sharedkv.stack.launch.providers import external_pair

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


def engine_for(settings: Settings, model: Path, gpus: Sequence[Gpu],
               free_gib: Sequence[float | None]) -> tuple[EngineSettings, list[str]]:
    """The perf arms' engine settings (CUDA graphs; the model's load settings, fp8 where
    the GPU has it; the user's flags; a KV cache each where a budget can be computed, so
    both replicas start together) and the report's lines on each choice."""
    from pytest_sharedkv.host.devices import compute_capability
    from pytest_sharedkv.models.compute_model import load_flags
    from pytest_sharedkv.stack.engine_settings import PERF_ENGINE

    capability = compute_capability(gpus[0]) if gpus else None
    load_format, quantization, load_why = load_flags(model, capability)
    notes = []
    if load_format is not None:
        notes.append(f"load: {load_why}")
    kv_bytes, kv_why = _kv_budget(settings, model, gpus, free_gib, quantization is not None)
    if kv_bytes is not None:
        notes.append(f"start: both replicas together, --kv-cache-memory-bytes {kv_bytes} "
                     f"each ({kv_why}): a block's restart is one engine start")
    else:
        notes.append(f"start: one replica after the other (vLLM sizes each cache from free "
                     f"memory; no explicit KV cache: {kv_why})")
    engine = replace(PERF_ENGINE, load_format=load_format, quantization=quantization,
                     kv_cache_bytes=kv_bytes, extra_args=settings.vllm_args)
    if kv_bytes is not None:
        engine = replace(engine, gpu_memory_utilization=_start_share(gpus, free_gib))
    notes.append("engine: " + " ".join(engine.flags()) + " (CUDA graphs: no --enforce-eager)"
                 + (f"; user flags: {' '.join(settings.vllm_args)}" if settings.vllm_args
                    else ""))
    return engine, notes


def _replicas_per_gpu(gpus: Sequence[Gpu]) -> int:
    """One replica on each of two GPUs, or both on one."""
    return 1 if len(gpus) > 1 else 2


def _start_share(gpus: Sequence[Gpu], free_gib: Sequence[float | None]) -> float:
    """--gpu-memory-utilization beside an explicit KV cache: vLLM then sizes nothing from
    it, but refuses to start unless free memory is at least that share of the total, and
    the second replica of a pair looks after the first has taken its part. One replica's
    share of the least free GPU (two on one GPU), as a share of its total, rounded down."""
    from pytest_sharedkv.models.compute_model import USABLE_SHARE

    per_gpu = _replicas_per_gpu(gpus)
    shares = [f / (g.total_mib / 1024) for g, f in zip(gpus, free_gib, strict=False)
              if f is not None and g.total_mib]
    free_share = min(shares, default=1.0)
    return math.floor(100 * USABLE_SHARE * min(free_share, 1.0) / per_gpu) / 100


def _kv_budget(settings: Settings, model: Path, gpus: Sequence[Gpu],
               free_gib: Sequence[float | None], fp8: bool) -> tuple[int | None, str]:
    """--kv-cache-memory-bytes for each replica: --sharedkv-kv-cache-gib, else from the
    leased GPUs' free memory less the model's weights; None (and why) where unknown."""
    from pytest_sharedkv.models.compute_model import is_compute_model, kv_budget_bytes, weight_gib
    from pytest_sharedkv.models.config_file import ModelConfigError, read_config

    if settings.kv_cache_gib is not None:
        return int(settings.kv_cache_gib * (1 << 30)), settings.source_of("kv_cache_gib")
    if not gpus:
        return None, "no leased GPU to read free memory from"
    known = [f for f in free_gib if f is not None]
    if len(known) < len(free_gib) or not known:
        return None, "the GPU's free memory is unknown"
    if is_compute_model(model):
        try:
            weights = weight_gib(read_config(model), fp8)
        except (ModelConfigError, KeyError, TypeError, ValueError) as exc:
            return None, f"its weights' size is unknown ({exc})"
    else:
        files = list(model.glob("*.safetensors"))
        if not files:
            return None, f"no safetensors in {model} to size its weights from"
        weights = sum(f.stat().st_size for f in files) / (1 << 30)
    return kv_budget_bytes(known, _replicas_per_gpu(gpus), weights)


def _model_record(model: Path, choice: ModelChoice | None) -> dict[str, str]:
    """What the report says of the served model: weights and compute, and why this one."""
    from pytest_sharedkv.models.compute_model import is_compute_model
    from pytest_sharedkv.models.geometry_model import is_geometry_model

    if is_compute_model(model):
        record = {"kind": "27b-compute", "weights": "random (vLLM --load-format dummy)",
                  "compute": "real: the 27B's width (5120) and FFN (17408), its KV geometry"}
    elif is_geometry_model(model):
        record = {"kind": "geometry", "weights": "seeded random",
                  "compute": "about 1/20 of the 27B's (small projections and experts); its "
                             "KV geometry"}
    else:
        record = {"kind": "checkpoint", "weights": f"the checkpoint in {model}",
                  "compute": "the checkpoint's"}
    record["why"] = choice.why if choice is not None else "--sharedkv-model"
    return record


def _vllm_setup(settings: Settings, arms: tuple[str, ...], model: Path,
                tmp_path_factory: pytest.TempPathFactory, gpus: Sequence[Gpu] = (),
                choice: ModelChoice | None = None, hosts: HostsSpec | None = None,
                l2: L2 | None = None) -> _Setup:
    from pytest_sharedkv.layouts.chunk_size import derive_chunk_size
    from pytest_sharedkv.models.compute_model import is_compute_model
    from pytest_sharedkv.models.geometry_model import is_geometry_model
    from pytest_sharedkv.stack.launch.providers import launch_vllm_pair
    from pytest_sharedkv.stack.launch.spec import LaunchSpec

    chunk = settings.chunk_size or derive_chunk_size(model)
    from pytest_sharedkv.host.devices import visible_tokens

    devices = visible_tokens()
    log_root = tmp_path_factory.mktemp("perf-vllm")
    engine, engine_notes = engine_for(settings, model, gpus, _free_gib(gpus))

    def launch(arm: str) -> ReplicaPair:  # ON: the validated (mixed) allocator; no gate hook
        return launch_vllm_pair(LaunchSpec(
            log_dir=log_root / f"{arm}-{time.monotonic_ns()}", allocator="mixed", model=model,
            devices=devices, arm=launch_arm(arm), gate=False, chunk_size=chunk,
            hosts=hosts if arm == "HOSTS" else None,
            # the context and the pools are set once the payloads are known
            max_model_len=setup.max_model_len,
            l1_size_gb={"NATIVE": setup.native_gb, "HOSTS": setup.hosts_gb}.get(
                arm, setup.l1_size_gb),
            engine=engine, compile_cache=log_root / "vllm-cache"))

    # VLLM_MAX_TOKENS: enough decode intervals for a decode rate, few enough that decoding
    # does not take over a block's time (every block sends over a hundred requests)
    setup = _Setup(launch, arms, chunk, _model_digest(model), words=_uses_copy_words(model),
                   model=model, max_tokens=VLLM_MAX_TOKENS)
    setup.model_record = _model_record(model, choice)
    setup.floor, line = _floor(model)
    setup.notes.append(line)
    if hosts is not None and l2 is not None:
        setup.floor, line = _l2_floor(setup.floor, l2)
        setup.notes.append(line)
    setup.notes.append(f"model: {setup.model_record['why']}")
    if is_geometry_model(model):
        setup.notes.append("geometry model: the 27B's KV and recurrent-state bytes with small "
                           "projections and experts, so its prefill compute is cheaper than "
                           "the real model's")
    if is_compute_model(model):
        setup.notes.append("27b-compute model: RANDOM weights (--load-format dummy), so "
                           "answers are noise; the compute is real (the 27B's width, FFN "
                           "and KV geometry), so prefill and decode times are the 27B's")
    setup.notes += engine_notes
    return setup


@dataclass(frozen=True)
class _SetupAsk:
    """What a provider's screening setup is made from: the settings, the block arms, the
    test's request (its lease, the run's config), where to write, the hosts topology."""

    settings: Settings
    arms: tuple[str, ...]
    request: pytest.FixtureRequest
    tmp_path_factory: pytest.TempPathFactory
    hosts: HostsSpec | None = None
    l2: L2 | None = None


def _stub_from(ask: _SetupAsk) -> _Setup:
    from pytest_sharedkv.stack.faults import planted

    return _stub_setup(ask.settings, ask.arms, ask.tmp_path_factory,
                       planted(ask.request.config).stub, ask.hosts)


def _external_from(ask: _SetupAsk) -> _Setup:
    return _external_setup(ask.settings)


def _vllm_from(ask: _SetupAsk) -> _Setup:
    gpus = _leased(ask.request.node)
    choice = choose_model(ask.settings, _free_gib(gpus))
    model = (ask.settings.model if ask.settings.model is not None else
             perf_model_dir(ask.request.config, ask.tmp_path_factory, choice.kind))
    return _vllm_setup(ask.settings, ask.arms, model, ask.tmp_path_factory, gpus, choice,
                       ask.hosts, ask.l2)


# each provider's screening setup, chosen in this one table by the resolved provider
SETUPS: dict[Provider, Callable[[_SetupAsk], _Setup]] = {
    Provider.STUB: _stub_from, Provider.EXTERNAL: _external_from, Provider.VLLM: _vllm_from}


@pytest.fixture
def sharedkv_perf_screening(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                            sharedkv_perf_provider: Resolved,
                            tmp_path_factory: pytest.TempPathFactory) -> BlockRunner:
    """The block runner for this run's provider: launched vLLM (OFF: prefix caching alone;
    ON: LMCache's MP connector, mixed allocator), the stub double (OFF: no shared pool), or
    external endpoints (one block as deployed). ``.run()`` gives the PerfRun."""
    from pytest_sharedkv.perf.blocks import BlockRunner, Plan, block_arms
    from pytest_sharedkv.stack.launch.spec import max_model_len
    from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
    from pytest_sharedkv.stack.namespaces import Namespaces, run_id

    settings = state_of(pytestconfig).settings
    resolved = sharedkv_perf_provider
    no_pair = resolved.serves_no_pair()
    if no_pair is not None:
        pytest.skip(no_pair + (" (or --sharedkv-provider stub to exercise the perf tier on "
                               "its test double)" if resolved.missing else ""))
    from pytest_sharedkv.config.engine import Engine

    if settings.engine is not Engine.VLLM and resolved.launched:
        pytest.skip(f"{settings.source_of('engine')} {settings.engine}: the perf tier's "
                    "blocks launch vLLM alone (OFF, ON, NATIVE); SGLang is judged by the "
                    "service tier")
    provider = resolved.provider
    arms = block_arms(settings.blocks, settings.treatment_arms)
    hosts = l2 = None
    if "HOSTS" in arms and provider is not Provider.EXTERNAL:
        from pytest_sharedkv.stack.fixtures import hosts_spec

        l2 = request.getfixturevalue("sharedkv_l2")
        hosts = hosts_spec(l2)
    setup = SETUPS[provider](_SetupAsk(settings, arms, request, tmp_path_factory, hosts, l2))
    payload_set = _payloads(settings, setup.words, setup.model, setup.chunk,
                            setup.max_tokens)
    if provider is Provider.VLLM and setup.model is not None:
        pool = _pool_size(setup.model, payload_set, hosts_arm="HOSTS" in arms,
                          l2_free_bytes=_l2_free_bytes(l2))
        if pool.dropped:  # the report says which and why (pool.why, in the notes)
            payload_set = _payloads(settings, setup.words, setup.model, setup.chunk,
                                    setup.max_tokens, without=pool.dropped)
        setup.l1_size_gb, setup.one_by_one = pool.gb, pool.one_by_one
        setup.native_gb, setup.hosts_gb = pool.native_gb, pool.hosts_gb
        setup.notes.append(_pool_note(pool, setup.arms))
    setup.max_model_len = max_model_len(_longest(payload_set), setup.max_tokens, setup.model)
    settle, per_token = setup.settle_s, setup.store_s_per_token
    if settings.settle_s is not None:
        settle, per_token = settings.settle_s, 0.0  # given: the whole wait
    plan = Plan(arms=setup.arms, provider=provider.value, max_tokens=setup.max_tokens,
                settle_s=settle, extra=setup.extra, restartable=provider is not Provider.EXTERNAL,
                one_by_one=frozenset(setup.one_by_one),
                store_s_per_token=STORE_S_PER_TOKEN if per_token is None else per_token)
    engine = _versions(provider.value if provider is not Provider.STUB else "stub (test double)",
                       _gpu_name(request.node))
    log = progress_logger(pytestconfig, "perf")
    log(f"perf screening on {provider}: blocks {'-'.join(setup.arms)}, sizes "
        f"{', '.join(payload_set.sizes())}; payloads {payload_set.source} "
        f"(digest {payload_set.digest})")
    namespaces = Namespaces(run_id(pytestconfig), request.node.nodeid)
    runner = BlockRunner(setup.launch, payload_set, plan, lambda key: namespaces(key).salt,
                         model_digest=setup.digest, engine=engine, floor=setup.floor,
                         notes=setup.notes, log=log,
                         chunk_tokens=setup.chunk if setup.chunk_known else None)
    runner.run_record.model = dict(setup.model_record)
    return runner


def _l2_free_bytes(l2: L2 | None) -> int | None:
    """Free bytes where a directory L2 writes (its nearest existing folder); None for an L2
    that keeps its entries elsewhere (a Redis: its memory, not sized here)."""
    import shutil

    from pytest_sharedkv.stack.l2.backends import DirectoryL2

    if not isinstance(l2, DirectoryL2):
        return None
    where = l2.path
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def _pool_size(model: Path, payload_set: PayloadSet, *, hosts_arm: bool = False,
               l2_free_bytes: int | None = None) -> PoolSize:
    """The ON arm's pool for these payloads, and NATIVE's and HOSTS's per-replica pools
    (pool_size.pool_size_gb)."""
    from pytest_sharedkv.corpus.cases import prompt_size
    from pytest_sharedkv.models.config_file import ModelConfigError, read_config
    from pytest_sharedkv.perf.pool_size import MINIMUM_GB, PoolSize, pool_size_gb

    try:
        config = read_config(model)
    except ModelConfigError as exc:
        return PoolSize(MINIMUM_GB, f"no config.json to size it from ({exc}): the minimum")
    tokens = {size: [prompt_size(p.prompt_tokens, p.text) for p in payload_set.of_size(size)]
              for size in payload_set.sizes()}
    return pool_size_gb(config, tokens, hosts_arm=hosts_arm, l2_free_bytes=l2_free_bytes)


def _pool_note(pool: PoolSize, arms: Sequence[str]) -> str:
    """What the screening's pools hold, for the arms it runs (a run without ON still says
    the pool its NATIVE offload is sized from)."""
    native = (f"the NATIVE arm offloads to {pool.native_gb:g} GB on each replica (vLLM's "
              "own, not shared; both replicas' on this host stay under its cap)")
    hosts = ("the HOSTS arm's two LMCache servers (one per replica, sharing the L2) "
             f"{pool.hosts_gb:g} GB of L1 each")
    if "ON" not in arms:
        sized = f"sized as the ON arm's {pool.gb:g} GB would be ({pool.why})"
        return "pool: " + "; ".join([*([hosts] if "HOSTS" in arms else []),
                                     *([native] if "NATIVE" in arms else [])]) + f", {sized}"
    return (f"pool: {pool.gb:g} GB of LMCache L1 in the ON arm ({pool.why})"
            + (f"; {hosts}" if "HOSTS" in arms else "")
            + (f"; {native}" if "NATIVE" in arms else ""))


def _longest(payload_set: PayloadSet) -> int:
    counts = [p.prompt_tokens or 0 for p in (*payload_set.requests, *payload_set.warmups)]
    counts += [t.prompt_tokens or 0 for s in payload_set.sessions for t in s.turns]
    return max(counts, default=0)


def attach_run(item: pytest.Item, run: PerfRun) -> None:
    """Keep RUN for the process that writes the JSON report: on the item, and as an
    attribute of its reports from now on (xdist serialises it; junitxml writes none).
    The test's user_properties, which junitxml writes into every XML report, get only
    where the screening is: the JSON report's path and the screening's digest."""
    from pytest_sharedkv.perf.observations import to_json

    data = to_json(run)
    item.stash[ITEM_PERF] = data
    json_path = state_of(item.config).settings.json
    where = f"in {json_path}" if json_path is not None else "no JSON report (--sharedkv-json)"
    item.user_properties[:] = [p for p in item.user_properties if p[0] != PERF_PROPERTY]
    item.user_properties.append((PERF_PROPERTY, f"sha256:{screening_digest(data)} {where}"))


def screening_digest(data: Mapping[str, Any]) -> str:
    """The sha256 of a screening's JSON (keys sorted): what junitxml's reference names."""
    import hashlib
    import json

    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each report of a test that attached a screening carries it (PERF_ATTRIBUTE)."""
    report = yield
    data = item.stash.get(ITEM_PERF, None)
    if data is not None:
        setattr(report, PERF_ATTRIBUTE, data)
    return report


def pytest_sharedkv_tier_report() -> TierReport:
    """The perf tier's part of the terminal summary."""
    from pytest_sharedkv.perf import summary
    from pytest_sharedkv.report.terminal import TierReport

    return TierReport("perf", lines=summary.summary_lines)
