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
from pytest_sharedkv.config.stack_choice import Stack
from pytest_sharedkv.config.tiers import is_sharedkv_item, parametrizes
from pytest_sharedkv.state import WORKER_USAGE_ERROR, state_of

if TYPE_CHECKING:  # runtime imports stay lazy
    from pytest_sharedkv.config.gating import Gate
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.host.leases import Lease
    from pytest_sharedkv.stack.faults import StubFaults
    from pytest_sharedkv.stack.l2.backends import L2
    from pytest_sharedkv.stack.launch.spec import LaunchSpec
    from pytest_sharedkv.stack.lmcache_server import LMCacheServer
    from pytest_sharedkv.stack.namespaces import Namespaces
    from pytest_sharedkv.stack.pair import ReplicaPair
    from pytest_sharedkv.stack.topology import HostsSpec

    Edit = Callable[[LaunchSpec], LaunchSpec]


TARGETS_ENV = "SHAREDKV_INJECT_TARGETS"  # delay_hook.TARGETS_ENV, without importing it
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
    end; a run that is not (yet) active leaves a stale shell variable alone. The hosts
    topology's L2 is checked now too, as far as it can be before anything starts."""
    if state_of(config).active:
        _check_targets(config)
        _check_l2(config)
        _check_l1(config)


def l1_problem(settings: Settings) -> str | None:
    """--sharedkv-l1-gib smaller than one chunk's bytes: each server's L1 could hold no
    chunk, and every cross-replica step would miss (a VOID that reads as a connector that
    is off). A chunk: the corpus chunk in tokens at the bytes a token takes, the stub's
    STUB_TOKEN_BYTES or, for a launched pair, at least the model's attention KV (from its
    config.json, or the copy model's). None where it holds a chunk or cannot be known."""
    resolved = resolve_provider(settings)
    if settings.l1_gib is None or resolved.provider is Provider.EXTERNAL:
        return None
    from pytest_sharedkv.corpus.choice import copy_chunk
    from pytest_sharedkv.layouts.chunk_size import kv_bytes_per_token_at_least
    from pytest_sharedkv.models.config_file import ModelConfigError, read_config
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict

    try:
        chunk = copy_chunk(settings)
        if resolved.provider is Provider.STUB:
            from pytest_sharedkv.stack.stub.stub_openai import STUB_TOKEN_BYTES

            per_token, what = STUB_TOKEN_BYTES, "the stub double's"
        else:
            model = (read_config(settings.model) if settings.model is not None
                     else config_dict(CopyModelRecipe()))
            per_token, what = kv_bytes_per_token_at_least(model), "at least the model's KV"
    except (ModelConfigError, KeyError, ValueError, TypeError):
        return None  # the model's own problem is said where it is loaded
    need = chunk * per_token
    if settings.l1_gib * (1 << 30) >= need:
        return None
    held = settings.l1_gib * (1 << 30)
    return (f"{settings.source_of('l1_gib')}: {settings.l1_gib:g} GiB ({held:.3g} bytes) "
            f"holds less than one chunk: a chunk of {chunk} tokens takes {need:,} "
            f"bytes ({what}, {per_token:,} a token); give at least "
            f"{need / (1 << 30):.3g} GiB")


def _check_l1(config: pytest.Config) -> None:
    problem = l1_problem(state_of(config).settings)
    if problem is not None:
        raise pytest.UsageError(problem)


def _check_l2(config: pytest.Config) -> None:
    """The hosts topology's L2 (--sharedkv-l2) is a usage error before any test where
    what it needs is missing: a Redis binary, an adapter type or its client the installed
    LMCache lacks, an existing L2 that does not answer, a directory that cannot hold files
    (stack.l2.configure_problem); the header names the topology either way."""
    from pytest_sharedkv.config.options import needs_l2
    from pytest_sharedkv.host.environment import TOPOLOGY_LINE

    settings = state_of(config).settings
    config.stash[TOPOLOGY_LINE] = topology_line(settings)
    if not needs_l2(settings):
        return
    from pytest_sharedkv.stack.l2.backends import configure_problem

    stub = resolve_provider(settings).provider is Provider.STUB
    problem = configure_problem(settings.l2, stub=stub)
    if problem is not None:
        raise pytest.UsageError(f"{settings.source_of('l2')} {settings.l2}: {problem.message}")


def topology_line(settings: Settings) -> str:
    """The header's line on where the pair's KV lives between its replicas."""
    l1 = (f"{settings.l1_gib:g} GiB L1 each ({settings.source_of('l1_gib')})"
          if settings.l1_gib is not None else "default L1")
    if settings.topology != "hosts":
        return f"topology: shared (one LMCache server both replicas use; {l1})"
    return (f"topology: hosts (one LMCache server per replica, sharing only the L2 "
            f"{settings.l2}; {l1})")


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The run becomes active with its first sharedkv item: the check comes before any test."""
    if any(is_sharedkv_item(item) for item in items):
        _check_targets(config, items)
        _check_stack(config, items)


def _check_targets(config: pytest.Config, items: list[pytest.Item] | None = None) -> None:
    if config.stash.get(TARGETS_CHECKED, False):
        return
    config.stash[TARGETS_CHECKED] = True
    problem = targets_problem()
    if problem is None:
        return
    if state_of(config).is_worker and items is not None:
        config.workeroutput[WORKER_USAGE_ERROR] = problem  # type: ignore[attr-defined]
        items[:] = []
        return
    raise pytest.UsageError(problem)



def _check_stack(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--sharedkv-stack native with a corpus it cannot size the GPU cache for, or
    inprocess where its shared Redis cannot start (no redis-server, no redis-py): a usage
    error before any test (on a worker, through the controller), not a failed start. The
    stub double starts no Redis; nor does a launched pair that cannot launch (no vllm:
    its tests skip saying so)."""
    settings = state_of(config).settings
    resolved = resolve_provider(settings)
    if settings.stack is Stack.MP or not resolved.launched or not any(
            SLOT in getattr(item, "fixturenames", ()) for item in items):
        return
    from pytest_sharedkv.stack.launch.stacks import inprocess_problem, native_problem

    if settings.stack is Stack.NATIVE:
        problem = native_problem(settings)
    else:
        problem = None if resolved.missing is not None else inprocess_problem(settings)
    if problem is None:
        return
    if state_of(config).is_worker:
        config.workeroutput[WORKER_USAGE_ERROR] = problem  # type: ignore[attr-defined]
        items[:] = []
        return
    raise pytest.UsageError(problem)


def resolve_provider(settings: Settings) -> Resolved:
    from pytest_sharedkv.config.engine import Engine

    resolved = resolve(settings.provider, settings.endpoints)
    if settings.engine is Engine.SGLANG and resolved.launched:
        # the launched pair runs SGLang, whose absence configure already refused
        return resolved._replace(missing=None)
    return resolved


def provider_marks(resolved: Resolved, gpus: int = 1, engine: str = "vllm") -> list[Any]:
    if resolved.launched:
        return [pytest.mark.sharedkv_gpu(count=gpus),
                pytest.mark.sharedkv_requires(engine, "lmcache")]
    return []


PAIR = "sharedkv_replica_pair"
SLOT = "sharedkv_pair_slot"  # what the matrix parametrizes: the pair behind PAIR
PAIR_TIERS = ("replica_pair", "service_regression")  # the tiers that send through a pair


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not any(parametrizes(metafunc, SLOT, tier) for tier in PAIR_TIERS):
        return
    from pytest_sharedkv.engine_hooks.delay_hook import cycles_label

    settings = state_of(metafunc.config).settings
    provider = resolve_provider(settings)
    launched = provider.launched
    allocators = settings.allocators if launched else ("n/a",)
    delays = settings.delays if launched else (0,)  # only launched processes get the hook
    if launched and settings.stack is not Stack.MP:  # no MP server, no allocator: one cell
        allocators = (settings.stack,)
    metafunc.parametrize(
        SLOT,
        [pytest.param((a, d), marks=[*provider_marks(provider, settings.pair_gpu_count,
                                                     settings.engine.value),
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
    from pytest_sharedkv.config.engine import Engine

    if state_of(pytestconfig).settings.engine is Engine.SGLANG:
        # SGLang 0.5.17 builds no LMCache radix cache for a GDN hybrid (registry.py
        # returns the unified radix cache first): the attention-only copy model
        return model_dir(pytestconfig, tmp_path_factory, "copy-attention",
                         _attention_copy_model)
    return model_dir(pytestconfig, tmp_path_factory, "copy", _copy_model)


def _attention_copy_model() -> tuple[str, Callable[[Path], object]]:
    from pytest_sharedkv.models.copy_attention_model import (
        AttentionCopyRecipe,
        make_attention_copy_model,
    )

    recipe = AttentionCopyRecipe()
    return recipe.key(), lambda path: make_attention_copy_model(path, recipe)


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
def sharedkv_l2(pytestconfig: pytest.Config,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[L2]:
    """The hosts topology's L2 for the session (--sharedkv-l2): a directory in the run's
    temporary directory, a Redis the suite starts (stopped at the end, nothing of it left),
    or the user's existing L2 (checked, never started or stopped). What keeps it from
    serving fails every test that needs it, naming the option."""
    from pytest_sharedkv.stack.l2 import backends as l2

    settings = state_of(pytestconfig).settings
    named = f"{settings.source_of('l2')} {settings.l2}"
    try:
        backend = l2.choose(settings.l2, tmp_path_factory.mktemp("l2"))
        backend.start()
    except l2.L2Unavailable as exc:
        pytest.fail(f"{named}: {exc.problem.message}", pytrace=False)
    yield backend
    leftovers = backend.stop()
    if leftovers:
        pytest.fail(f"{named}: processes {leftovers} survived its stop", pytrace=False)


def hosts_spec(l2: L2, reader_adapter: str | None = None, cell: str | None = None
               ) -> HostsSpec:
    """The hosts topology over L2 (server 2's adapter READER_ADAPTER where it differs)."""
    from pytest_sharedkv.stack.topology import HostsSpec

    return HostsSpec(l2.adapter_json(), l2.describe(), reader_adapter, cell)


Launcher = Callable[["Lease | None", "Edit | None"], "ReplicaPair"]


class PairSlot:
    """One matrix cell's replica pair, shared by every test of the session that uses it;
    no test closes it. ``pair`` starts it on first use, and again after ``release``, under
    a GPU lease of its own that lives as long as its engines (the tests' leases end with
    each test); ``release`` stops it and frees that lease, for work that needs its GPU (the
    triage's cells); ``launch`` starts another pair from the same spec, edited, on the
    running test's devices, which its caller closes."""

    def __init__(self, what: str, launcher: Launcher, relaunchable: bool,
                 gate: Callable[[], Gate | None]) -> None:
        self.what = what  # the lease holder's name for it
        self.relaunchable = relaunchable  # False: external endpoints, nothing launched
        self._launcher = launcher
        self._gate = gate  # this process's, once a test leased a device
        self._pair: ReplicaPair | None = None
        self._lease: Lease | None = None
        self._failed: Exception | None = None

    @property
    def pair(self) -> ReplicaPair:
        if self._failed is not None:  # every later user sees why, as for a session fixture
            raise self._failed
        if self._pair is None:
            gate = self._gate()
            lease = None if gate is None else gate.hold(f"{self.what} (until the pair stops)")
            try:
                self._pair = self._launcher(lease, None)
            except Exception as exc:  # a start that failed is not tried again for each test
                self._failed = exc
                self._free(lease)
                raise
            except BaseException:
                self._free(lease)
                raise
            self._lease = lease
        return self._pair

    @property
    def live(self) -> bool:
        return self._pair is not None

    @property
    def lease(self) -> Lease | None:
        """The GPU lease the live pair holds (None: no pair, or one on no leased GPU)."""
        return self._lease

    def release(self) -> list[int]:
        """Stop the pair (replicas, then the server) and free its lease; the next ``pair``
        starts it again. Returns the PIDs that survived (must be none); survivors may hold
        the GPU, so their lease is kept."""
        pair, lease = self._pair, self._lease
        self._pair = self._lease = None
        leftovers = pair.close() if pair is not None else []
        if not leftovers:
            self._free(lease)
        return leftovers

    def launch(self, edit: Edit) -> ReplicaPair:
        """A pair of its own from this slot's spec with EDIT applied (the triage's cells),
        on the running test's devices; the caller closes it."""
        if not self.relaunchable:
            raise ValueError(f"{self.what}: the suite launched nothing it could launch again")
        gate = self._gate()
        return self._launcher(gate.current if gate is not None else None, edit)

    def _free(self, lease: Lease | None) -> None:
        gate = self._gate()
        if lease is not None and gate is not None:
            gate.release(lease)


@pytest.fixture(scope="session")
def sharedkv_pair_slot(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[PairSlot]:
    """The (allocator x delay) cell's pair for the session (``PairSlot``): launched (vllm),
    external endpoints, or the stub test double; torn down (replicas, then the server)
    with no process left."""
    settings = state_of(pytestconfig).settings
    provider = resolve_provider(settings)
    if getattr(request, "param", None) is None:
        pytest.fail(f"{PAIR} is parametrized only for tests marked "
                    f"{' or '.join(f'@pytest.mark.{t}' for t in PAIR_TIERS)}", pytrace=False)
    allocator, delay = request.param
    no_pair = provider.serves_no_pair()
    if no_pair is not None:
        pytest.skip(no_pair)
    cases = None if provider.provider is Provider.EXTERNAL else \
        request.getfixturevalue("sharedkv_case_set")
    model = request.getfixturevalue("sharedkv_model_dir") if provider.launched else None
    label = f"{provider}-{allocator.replace('/', '')}-{delay}"
    from pytest_sharedkv.stack.faults import planted

    hosts = (hosts_spec(request.getfixturevalue("sharedkv_l2"))
             if settings.topology == "hosts" else None)
    slot = PairSlot(f"{SLOT}[{label}]",
                    _launcher(settings, provider, allocator, delay, cases, model,
                              lambda: tmp_path_factory.mktemp(f"replicas-{label}"),
                              planted(pytestconfig).stub, hosts),
                    relaunchable=provider.provider is not Provider.EXTERNAL,
                    gate=lambda: state_of(pytestconfig).gate)
    yield slot
    leftovers = slot.release()
    if leftovers:
        pytest.fail(f"replica processes {leftovers} survived teardown", pytrace=False)


def _launcher(settings: Settings, provider: Resolved, allocator: str, delay: int,
              cases: CaseSet | None, model: Path | None, log_dir: Callable[[], Path],
              stub_faults: StubFaults, hosts: HostsSpec | None = None) -> Launcher:
    """How the slot starts a pair: a plan per launch (``stack.launch.plan.plan_launch``: a
    fresh log directory; a launched pair's engines on the lease's devices, with the lease's
    environment; in the hosts topology a server per replica over HOSTS's L2; each server's
    L1 the option's), started."""
    from pytest_sharedkv.stack.launch.plan import plan_launch
    from pytest_sharedkv.stack.launch.spec import StackUnavailable

    def launch(lease: Lease | None, edit: Edit | None) -> ReplicaPair:
        if provider.provider is Provider.VLLM and lease is None:
            pytest.fail(f"{PAIR}: a launched pair runs on leased GPUs and the test that starts"
                        " it leased none (it needs @pytest.mark.sharedkv_gpu)", pytrace=False)
        try:
            plan = plan_launch(
                settings, provider.provider,
                log_dir=None if provider.provider is Provider.EXTERNAL else log_dir(),
                cases=cases, model=model, allocator=allocator, delay=delay,
                stub_faults=stub_faults, hosts=hosts, lease=lease, edit=edit)
            return plan.start()
        except StackUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)

    return launch


@pytest.fixture
def sharedkv_replica_pair(sharedkv_pair_slot: PairSlot) -> ReplicaPair:
    """Two replicas over one LMCache pool, live (``PairSlot.pair``): the session's pair of
    this test's (allocator, delay) cell. A test never closes it."""
    return sharedkv_pair_slot.pair


@pytest.fixture
def sharedkv_kv_namespace(request: pytest.FixtureRequest) -> Namespaces:
    """``sharedkv_kv_namespace(label)`` -> a fresh cache_salt for this case (and label)."""
    from pytest_sharedkv.stack.namespaces import Namespaces, run_id

    return Namespaces(run_id(request.config), request.node.nodeid)

