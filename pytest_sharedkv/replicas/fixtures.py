"""The replica tier's pytest side: the tiny model, the LMCache server, replica pairs and
cache namespaces as fixtures, and the (allocator) matrix of ``replica_pair`` tests."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from filelock import FileLock

from pytest_sharedkv.options import Settings
from pytest_sharedkv.replicas.delay_hook import TARGETS_ENV, check_targets, cycles_label
from pytest_sharedkv.replicas.namespaces import Namespaces, run_id
from pytest_sharedkv.replicas.transfer import TransferCase
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:  # runtime imports stay lazy
    from pytest_sharedkv.replicas.lmcache_server import LMCacheServer
    from pytest_sharedkv.replicas.pair import ReplicaPair


def pytest_configure(config: pytest.Config) -> None:
    """A bad SHAREDKV_INJECT_TARGETS stops the run now, not as a VOID result at the end."""
    text = os.environ.get(TARGETS_ENV)
    if text:
        problems = check_targets(text)
        if problems:
            raise pytest.UsageError(
                f"{TARGETS_ENV}={text}: {'; '.join(problems)} (it takes module:function,... "
                "naming the functions the fault-sensitivity delay wraps)")


def resolve_provider(settings: Settings) -> str:
    if settings.provider != "auto":
        return settings.provider
    if settings.endpoints:
        return "external"
    if importlib.util.find_spec("vllm") is not None:
        return "vllm"
    return "vllm-missing"


def provider_marks(provider: str) -> list[Any]:
    if provider in ("vllm", "vllm-missing"):
        return [pytest.mark.sharedkv_gpu, pytest.mark.sharedkv_requires("vllm", "lmcache")]
    return []


def transfer_cases(settings: Settings) -> list[Any]:
    """The transfer provider's matrix: the CPU server (CI; LMCache turns lazy L1 off
    without CUDA, so mixed only, and no delay: the hook delays GPU streams), then on a
    leased GPU every allocator, undelayed and, in fault-sensitivity mode, delayed."""
    cases = [TransferCase("cpu", "mixed", 0)]
    cases += [TransferCase("cuda", a, d) for a in settings.allocators for d in settings.delays]
    return [pytest.param(c, id=c.id, marks=[pytest.mark.sharedkv_gpu] if c.device == "cuda"
                         else []) for c in cases]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "transfer_case" in metafunc.fixturenames:
        metafunc.parametrize("transfer_case", transfer_cases(state_of(metafunc.config).settings))
    if "replica_pair" not in metafunc.fixturenames:
        return
    settings = state_of(metafunc.config).settings
    provider = resolve_provider(settings)
    launched = provider in ("vllm", "vllm-missing")
    allocators = settings.allocators if launched else ("n/a",)
    delays = settings.delays if launched else (0,)  # only launched processes get the hook
    metafunc.parametrize(
        "replica_pair",
        [pytest.param((a, d), marks=provider_marks(provider),
                      id=(a if launched else provider) + (f"-delay{cycles_label(d)}" if d else ""))
         for a in allocators for d in delays],
        indirect=True, scope="session")


@pytest.fixture(scope="session")
def tiny_model(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """--sharedkv-model, or the tiny hybrid model generated once per run (xdist-safe)."""
    settings = state_of(pytestconfig).settings
    if settings.model is not None:
        if not (settings.model / "config.json").exists():
            pytest.fail(f"--sharedkv-model {settings.model}: no config.json there",
                        pytrace=False)
        return settings.model
    try:
        from pytest_sharedkv.replicas.tiny_model import TinyModelRecipe, card, make_model
    except ImportError as exc:
        pytest.skip(f"the tiny model needs transformers and tokenizers: {exc}")
    recipe = TinyModelRecipe()
    root = tmp_path_factory.getbasetemp().parent
    path = root / f"sharedkv-tiny-model-{recipe.key()}"
    with FileLock(str(path) + ".lock"):
        if not (path / "model.safetensors").exists():
            make_model(path, recipe)
    return card(path).path


@pytest.fixture
def lmcache_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LMCacheServer]:
    """A real LMCache server on free 127.0.0.1 ports (allocator: the param, else mixed);
    its process group is killed at teardown and nothing of it may survive."""
    from pytest_sharedkv.replicas.lmcache_server import LMCacheServer, ServerConfig

    allocator = getattr(request, "param", "mixed")
    server = LMCacheServer(ServerConfig(allocator=allocator, l1_size_gb=0.25), tmp_path)
    server.start()
    yield server
    leftovers = server.stop()
    if leftovers:
        pytest.fail(f"LMCache server processes {leftovers} survived teardown", pytrace=False)


@pytest.fixture(scope="session")
def replica_pair(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaPair]:
    """Two replicas over one LMCache pool: launched (vllm), external endpoints, or the
    stub test double; torn down (replicas, then the server) with no process left."""
    from pytest_sharedkv.replicas.providers import (
        LaunchSpec,
        derive_chunk_size,
        external_pair,
        launch_vllm_pair,
        stub_pair,
    )

    settings = state_of(pytestconfig).settings
    provider = resolve_provider(settings)
    allocator, delay = request.param
    log_dir = tmp_path_factory.mktemp(f"replicas-{provider}-{allocator.replace('/', '')}-{delay}")
    if provider == "external":
        pair = external_pair(settings.endpoints or ())
    elif provider == "stub":
        pair = stub_pair(LaunchSpec(log_dir=log_dir))
    elif provider == "vllm":
        model = request.getfixturevalue("tiny_model")
        devices = tuple(t for t in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if t)
        pair = launch_vllm_pair(LaunchSpec(
            log_dir=log_dir, allocator=allocator, model=model, devices=devices,
            inject_delay_cycles=delay,
            chunk_size=settings.chunk_size or derive_chunk_size(model)))
    elif provider == "vllm-missing":
        pytest.skip("vllm not importable: the launched provider needs it "
                    "(or pass --sharedkv-endpoints for an existing deployment)")
    else:
        pytest.skip(f"replica provider {provider!r} is not available in this version")
    yield pair
    leftovers = pair.close()
    if leftovers:
        pytest.fail(f"replica processes {leftovers} survived teardown", pytrace=False)


@pytest.fixture
def kv_namespace(request: pytest.FixtureRequest) -> Namespaces:
    """``kv_namespace(label)`` -> a fresh cache_salt for this case (and label)."""
    return Namespaces(run_id(request.config), request.node.nodeid)

