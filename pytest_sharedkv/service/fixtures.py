"""The service tier's pytest side: one pass of the corpus per replica pair (session
fixture), and the parameters of its tests: one per request, session and protocol check.

Every name is ``sharedkv_*``. The pass runs once, at the first service test of a pair,
and the tests read its answers, so requests can go concurrently and in steps while pytest
still reports one outcome per request. Under xdist, ``--dist loadgroup`` keeps each
pair's tests on one worker (they carry an ``xdist_group`` per pair); other modes give
each worker a pass of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_sharedkv.config.tiers import parametrizes, tier_of
from pytest_sharedkv.report.progress import progress_logger
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.corpus.cases import CaseSet
    from pytest_sharedkv.report.terminal import TierReport
    from pytest_sharedkv.service.baseline import Baseline
    from pytest_sharedkv.service.execute import Pass
    from pytest_sharedkv.stack.fixtures import PairSlot

CASE = "sharedkv_service_case"
SESSION = "sharedkv_service_session"
PROTOCOL = "sharedkv_protocol_check"
TIER = "service_regression"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    settings = state_of(metafunc.config).settings
    if parametrizes(metafunc, CASE, TIER):
        from pytest_sharedkv.corpus.choice import measured_ids

        ids = measured_ids(settings)
        metafunc.parametrize(CASE, ids, ids=ids)
    if parametrizes(metafunc, SESSION, TIER):
        from pytest_sharedkv.corpus.copy_corpus import SESSIONS

        ids = [f"session-{i:02d}" for i in range(SESSIONS)]
        metafunc.parametrize(SESSION, ids, ids=ids)
    if parametrizes(metafunc, PROTOCOL, TIER):
        from pytest_sharedkv.service.protocol import CHECKS

        metafunc.parametrize(PROTOCOL, list(CHECKS), ids=list(CHECKS))


@pytest.fixture(scope="session")
def sharedkv_service_pass(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                          sharedkv_pair_slot: PairSlot, sharedkv_case_set: CaseSet
                          ) -> Pass:
    """The corpus through the session's pair, once, in stages the tests ask for
    (``ensure``): warm-ups and the sensitivity gate, each size by step, the identical
    requests in flight together, sessions, protocol checks. ``Pass.pair`` is the pair it
    ran on, for the tests to read (labels, logs)."""
    from pytest_sharedkv.service.execute import Pass
    from pytest_sharedkv.stack.lmcache_server import STORE_S_PER_TOKEN
    from pytest_sharedkv.stack.namespaces import Namespaces, run_id

    settings = state_of(pytestconfig).settings
    pair = sharedkv_pair_slot.pair
    namespaces = Namespaces(run_id(pytestconfig), f"service/{pair.description}/"
                            f"{'-'.join(pair.labels.values())}")
    log_dir: Path = request.getfixturevalue("tmp_path_factory").mktemp("service")
    progress = progress_logger(pytestconfig, "service", log_dir / "progress.log")
    progress(f"{pair.description} ({', '.join(f'{k} {v}' for k, v in pair.labels.items())}):"
             f" {len(sharedkv_case_set.cases)} cases, {len(sharedkv_case_set.sessions)} "
             f"sessions; corpus: {sharedkv_case_set.source}")
    # an explicit --sharedkv-settle-s is the whole settle; by default it grows with the
    # tokens LMCache must store first
    per_token = 0.0 if settings.settle_s is not None else STORE_S_PER_TOKEN
    sharedkv_case_set.make_payloads()
    service_pass = Pass(pair, sharedkv_case_set, lambda key: namespaces(key).salt,
                        settings.settle_for(pair.delay_cycles),
                        concurrency=settings.concurrency, log=progress,
                        store_s_per_token=per_token, identical=settings.identical_requests,
                        gate=settings.gate)
    from pytest_sharedkv.service.gpu_fit import header_line

    fits = header_line(service_pass.run, launched_engines=pair.record.provider == "vllm")
    if fits is not None:  # why a local step may be served by the pool, said before it runs
        progress(fits)
    return service_pass


BASELINE: pytest.StashKey[Baseline] = pytest.StashKey()


@pytest.hookimpl(trylast=True)  # after the plugin's own, which puts the settings in place
def pytest_configure(config: pytest.Config) -> None:
    """--sharedkv-baseline is read now: a file that is no sharedkv report stops the run
    before any test, naming the option and the file; so does a fault catalogue naming a
    class there is none of."""
    settings = state_of(config).settings
    snapshots = settings.snapshot_dir
    if snapshots is not None and snapshots.exists() and not snapshots.is_dir():
        raise pytest.UsageError(f"{settings.source_of('snapshot_dir')}: {snapshots} is not a "
                                "directory (it names where stored reference answers live)")
    if settings.fault_catalogue is not None:
        from pytest_sharedkv.config.options import uses_l2
        from pytest_sharedkv.service.catalogue import CatalogueError, topology_problem

        try:
            problem = topology_problem(settings.fault_catalogue, uses_l2(settings))
        except CatalogueError as exc:
            problem = str(exc)
        if problem is not None:
            raise pytest.UsageError(f"{settings.source_of('fault_catalogue')}: {problem}")
    if settings.baseline is None:
        return
    from pytest_sharedkv.service.baseline import BaselineError, read_baseline

    try:
        config.stash[BASELINE] = read_baseline(settings.baseline)
    except BaselineError as exc:
        raise pytest.UsageError(f"{settings.source_of('baseline')}: {exc}") from None


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--snapshot-update for service tests with no --sharedkv-snapshot-dir would write into
    the installed package: a usage error before any test, naming the option."""
    if not getattr(config.option, "update_snapshots", False) \
            or state_of(config).settings.snapshot_dir is not None \
            or not any(tier_of(item) == TIER for item in items):
        return
    from pytest_sharedkv.service.references import default_root, installed_problem
    from pytest_sharedkv.state import WORKER_USAGE_ERROR

    problem = installed_problem(default_root())
    if problem is None:
        return
    if hasattr(config, "workerinput"):  # the controller says it (plugin.pytest_testnodedown)
        config.workeroutput[WORKER_USAGE_ERROR] = problem  # type: ignore[attr-defined]
        items[:] = []
        return
    raise pytest.UsageError(problem)


def pytest_sharedkv_tier_report(config: pytest.Config) -> TierReport:
    """The service_regression tier's part of the terminal summary (with the baseline, a
    remedy it proves is said as proven)."""
    from functools import partial

    from pytest_sharedkv.report.terminal import TierReport
    from pytest_sharedkv.service import summary

    return TierReport("service_regression", own_table=True,
                      lines=partial(summary.summary_lines,
                                    baseline=config.stash.get(BASELINE, None),
                                    kernel_path=_kernel_path(config),
                                    catalogue=_catalogue(config)))


def _catalogue(config: pytest.Config) -> tuple[str, ...] | None:
    """The fault classes this run chose (None: the catalogue was not asked for)."""
    from pytest_sharedkv.service.catalogue import CatalogueError, chosen

    names = state_of(config).settings.fault_catalogue
    if names is None:
        return None
    try:
        return tuple(c.name for c in chosen(names))
    except CatalogueError:  # a usage error before any test: nothing ran to summarise
        return None


def _kernel_path(config: pytest.Config) -> str | None:
    """This run's LMCache kernel path, where the header probed it."""
    state = state_of(config)
    lmcache = state.lmcache
    return None if lmcache is None or isinstance(lmcache, str) else lmcache.kernel_path
