"""The stack's pytest side, shared by the tiers that send through a pair (replica_pair,
service_regression, perf): the served model, the LMCache server, replica pairs and cache
namespaces as fixtures, and the (allocator x delay) matrix of the tests that use a pair.
Every fixture is named ``sharedkv_*`` and the matrix parametrizes only tests of the
replica and service tiers (``tiers.parametrizes``), so a project's own ``replica_pair``
fixture is never parametrized or shadowed by the plugin. Imports stay light: this module
loads with the plugin in every pytest run, and until the run is active it reads no
environment into an error and writes nothing."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.config.provider import Provider, Resolved, resolve
from pytest_sharedkv.config.tiers import is_sharedkv_item, parametrizes
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:  # runtime imports stay lazy
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer
    from pytest_sharedkv.stack.namespaces import Namespaces
    from pytest_sharedkv.stack.pair import ReplicaPair


TARGETS_ENV = "SHAREDKV_INJECT_TARGETS"  # delay_hook.TARGETS_ENV, without importing it
# an xdist worker's bad SHAREDKV_INJECT_TARGETS, for the controller to raise (a worker
# cannot stop the run itself)
TARGETS_PROBLEM = "sharedkv_inject_targets_problem"
TARGETS_CHECKED = pytest.StashKey[bool]()


def targets_problem() -> str | None:
    """What is wrong with SHAREDKV_INJECT_TARGETS, or None (unset or good)."""
    text = os.environ.get(TARGETS_ENV)
    if not text:
        return None
    from pytest_sharedkv.engine_hooks.delay_hook import check_targets

    problems = check_targets(text)
    if not problems:
        return None
    return (f"{TARGETS_ENV}={text}: {'; '.join(problems)} (it takes module:function,... "
            "naming the functions the fault-sensitivity delay wraps)")


@pytest.hookimpl(trylast=True)  # after the plugin's own, which puts the run state in place
def pytest_configure(config: pytest.Config) -> None:
    """A bad SHAREDKV_INJECT_TARGETS stops an active run now, not as a VOID result at the
    end; a run that is not (yet) active leaves a stale shell variable alone."""
    if state_of(config).active:
        _check_targets(config)


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The run becomes active with its first sharedkv item: the check comes before any test."""
    if any(is_sharedkv_item(item) for item in items):
        _check_targets(config, items)


def _check_targets(config: pytest.Config, items: list[pytest.Item] | None = None) -> None:
    if config.stash.get(TARGETS_CHECKED, False):
        return
    config.stash[TARGETS_CHECKED] = True
    problem = targets_problem()
    if problem is None:
        return
    if state_of(config).is_worker and items is not None:
        config.workeroutput[TARGETS_PROBLEM] = problem  # type: ignore[attr-defined]
        items[:] = []
        return
    raise pytest.UsageError(problem)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist controller: a worker found SHAREDKV_INJECT_TARGETS unusable (see above)."""
    problem = getattr(node, "workeroutput", {}).get(TARGETS_PROBLEM)
    if problem:
        raise pytest.UsageError(problem)


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
    (key, make) writes, once per run: in the run's own temp directory (under xdist the
    workers' common parent) and a file lock, so xdist workers share one (DONE: the file
    that says a directory is complete). MAKER imports what it needs; missing torch etc. is
    a skip."""
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

    root = tmp_path_factory.getbasetemp()
    if hasattr(pytestconfig, "workerinput"):  # pytest-N/popen-gwK: pytest-N is the run's
        root = root.parent
    path = root / f"sharedkv-{kind}-model-{key}"
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
        cases = request.getfixturevalue("sharedkv_case_set")
        pair = stub_pair(LaunchSpec(log_dir=log_dir, chunk_size=cases.chunk or 32,
                                    kv_audit=settings.kv_audit,
                                    engine=EngineSettings(extra_args=settings.vllm_args)))
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

