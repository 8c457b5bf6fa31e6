"""The stack's pytest side, shared by the tiers that send through a pair (replica_pair,
service_regression, perf): the served model, the LMCache server, replica pairs and cache
namespaces as fixtures, and the (allocator x delay) matrix of the tests that use a pair.
Every fixture is named ``sharedkv_*`` and the matrix parametrizes only tests of the
replica and service tiers (``tiers.parametrizes``), so a project's own ``replica_pair``
fixture is never parametrized or shadowed by the plugin. Imports stay
light: this module loads with the plugin in every pytest run."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.config.provider import Provider, Resolved, resolve
from pytest_sharedkv.config.tiers import parametrizes
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:  # runtime imports stay lazy
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer
    from pytest_sharedkv.stack.namespaces import Namespaces
    from pytest_sharedkv.stack.pair import ReplicaPair


TARGETS_ENV = "SHAREDKV_INJECT_TARGETS"  # delay_hook.TARGETS_ENV, without importing it


def pytest_configure(config: pytest.Config) -> None:
    """A bad SHAREDKV_INJECT_TARGETS stops the run now, not as a VOID result at the end."""
    text = os.environ.get(TARGETS_ENV)
    if text:
        from pytest_sharedkv.engine_hooks.delay_hook import check_targets

        problems = check_targets(text)
        if problems:
            raise pytest.UsageError(
                f"{TARGETS_ENV}={text}: {'; '.join(problems)} (it takes module:function,... "
                "naming the functions the fault-sensitivity delay wraps)")


def resolve_provider(settings: Settings) -> Resolved:
    return resolve(settings.provider, settings.endpoints)


def provider_marks(resolved: Resolved, gpus: int = 1) -> list[Any]:
    if resolved.launched:
        return [pytest.mark.sharedkv_gpu(count=gpus),
                pytest.mark.sharedkv_requires("vllm", "lmcache")]
    return []


PAIR = "sharedkv_replica_pair"
PAIR_TIERS = ("replica_pair", "service_regression")  # the tiers that send through a pair


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not any(parametrizes(metafunc, PAIR, tier) for tier in PAIR_TIERS):
        return
    from pytest_sharedkv.engine_hooks.delay_hook import cycles_label

    settings = state_of(metafunc.config).settings
    provider = resolve_provider(settings)
    launched = provider.launched
    allocators = settings.allocators if launched else ("n/a",)
    delays = settings.delays if launched else (0,)  # only launched processes get the hook
    metafunc.parametrize(
        PAIR,
        [pytest.param((a, d), marks=[*provider_marks(provider, int(settings.pair_gpus)),
                                     pytest.mark.xdist_group(
            f"sharedkv-pair-{a}-{d}")],
                      id=(a if launched else provider.name)
                      + (f"-delay{cycles_label(d)}" if d else ""))
         for a in allocators for d in delays],
        indirect=True, scope="session")


def model_dir(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory,
              kind: str, maker: Callable[[], tuple[str, Callable[[Path], object]]],
              done: str = "model.safetensors") -> Path:
    """--sharedkv-model (it must hold a config.json), or the KIND model that MAKER's
    (key, make) writes, once per run: under the run's base temp and a file lock, so xdist
    workers share one (DONE: the file that says a directory is complete). MAKER imports
    what it needs; missing torch etc. is a skip."""
    settings = state_of(pytestconfig).settings
    if settings.model is not None:
        if not (settings.model / "config.json").exists():
            pytest.fail(f"{settings.source_of('model')} {settings.model}: no config.json there",
                        pytrace=False)
        return settings.model
    try:
        key, make = maker()
    except ImportError as exc:
        pytest.skip(f"the {kind} model needs torch, transformers and safetensors: {exc}")
    from filelock import FileLock

    path = tmp_path_factory.getbasetemp().parent / f"sharedkv-{kind}-model-{key}"
    with FileLock(str(path) + ".lock"):
        if not (path / done).exists():
            make(path)
    return path


def _copy_model() -> tuple[str, Callable[[Path], object]]:
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, make_copy_model

    recipe = CopyModelRecipe()
    return recipe.key(), lambda path: make_copy_model(path, recipe)


@pytest.fixture(scope="session")
def sharedkv_model_dir(pytestconfig: pytest.Config,
                       tmp_path_factory: pytest.TempPathFactory) -> Path:
    """--sharedkv-model, or the copy model (KV-sensitive by construction) generated once
    per run (xdist-safe)."""
    return model_dir(pytestconfig, tmp_path_factory, "copy", _copy_model)


@pytest.fixture(scope="session")
def sharedkv_case_set(pytestconfig: pytest.Config) -> CaseSet:
    """What the service tier (and the replica tier's round) sends: the copy model's corpus,
    or a text corpus for a user's model (reference: replica A's cold answer)."""
    from pytest_sharedkv.corpus.choice import case_set

    try:
        return case_set(state_of(pytestconfig).settings)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def sharedkv_lmcache_server(request: pytest.FixtureRequest, tmp_path: Path
                            ) -> Iterator[LMCacheServer]:
    """A real LMCache server on free 127.0.0.1 ports (allocator: the param, else mixed);
    its process group is killed at teardown and nothing of it may survive."""
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer, ServerConfig

    allocator = getattr(request, "param", "mixed")
    server = LMCacheServer(ServerConfig(allocator=allocator, l1_size_gb=0.25), tmp_path)
    server.start()
    yield server
    leftovers = server.stop()
    if leftovers:
        pytest.fail(f"LMCache server processes {leftovers} survived teardown", pytrace=False)


@pytest.fixture(scope="session")
def sharedkv_replica_pair(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                          tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaPair]:
    """Two replicas over one LMCache pool: launched (vllm), external endpoints, or the
    stub test double; torn down (replicas, then the server) with no process left."""
    from pytest_sharedkv.layouts.chunk_size import derive_chunk_size
    from pytest_sharedkv.stack.providers import (
        EngineSettings,
        LaunchSpec,
        external_pair,
        launch_vllm_pair,
        max_model_len,
        stub_pair,
    )

    settings = state_of(pytestconfig).settings
    provider = resolve_provider(settings)
    if getattr(request, "param", None) is None:
        pytest.fail(f"{PAIR} is parametrized only for tests marked "
                    f"{' or '.join(f'@pytest.mark.{t}' for t in PAIR_TIERS)}", pytrace=False)
    allocator, delay = request.param
    no_pair = provider.serves_no_pair()
    if no_pair is not None:
        pytest.skip(no_pair)
    log_dir = tmp_path_factory.mktemp(f"replicas-{provider}-{allocator.replace('/', '')}-{delay}")
    if provider.provider is Provider.EXTERNAL:
        pair = external_pair(settings.endpoints or ())
    elif provider.provider is Provider.STUB:
        from pytest_sharedkv.stack.faults import planted

        cases = request.getfixturevalue("sharedkv_case_set")
        pair = stub_pair(LaunchSpec(log_dir=log_dir, chunk_size=cases.chunk or 32,
                                    kv_audit=settings.kv_audit,
                                    engine=EngineSettings(extra_args=settings.vllm_args),
                                    stub_faults=planted(pytestconfig).stub))
    else:
        model = request.getfixturevalue("sharedkv_model_dir")
        cases = request.getfixturevalue("sharedkv_case_set")
        from pytest_sharedkv.host.devices import visible_tokens

        devices = visible_tokens()
        pair = launch_vllm_pair(LaunchSpec(
            log_dir=log_dir, allocator=allocator, model=model, devices=devices,
            inject_delay_cycles=delay,
            max_model_len=max_model_len(longest_prompt(cases), cases.answer_tokens, model),
            chunk_size=settings.chunk_size or derive_chunk_size(model),
            kv_audit=settings.kv_audit,
            engine=EngineSettings(extra_args=settings.vllm_args)))
    yield pair
    leftovers = pair.close()
    if leftovers:
        pytest.fail(f"replica processes {leftovers} survived teardown", pytrace=False)


def longest_prompt(cases: CaseSet) -> int:
    """The longest prompt the corpus sends (its cases and session turns), in tokens."""
    longest = max((c.prompt_tokens or 0 for c in cases.cases), default=0)
    return max([longest, *(t.prompt_tokens or 0 for s in cases.sessions for t in s.turns)])


@pytest.fixture
def sharedkv_kv_namespace(request: pytest.FixtureRequest) -> Namespaces:
    """``sharedkv_kv_namespace(label)`` -> a fresh cache_salt for this case (and label)."""
    from pytest_sharedkv.stack.namespaces import Namespaces, run_id

    return Namespaces(run_id(request.config), request.node.nodeid)

