"""The pytest entry point (``pytest11: sharedkv``): hooks and the core fixtures, nothing heavy.

Loading this module must not import torch, lmcache or vllm, and in a project without
sharedkv tests the plugin must cost nothing: until the run is *active* (a ``--sharedkv-*``
option or ini value is given, or a sharedkv item is collected: ``tiers.is_sharedkv_item``)
it runs no subprocess, writes no file and prints no line. The tiers' pytest modules,
device discovery, the environment header, the lmcache probe and the report modules come
with the first need. Run state lives in ``config.stash``. Nothing here depends on xdist:
records cross from workers to the controller on ``user_properties`` and report attributes,
which xdist serialises, so ``-p no:xdist`` behaves the same; only the records no report
brings (a test interrupted in a worker) come through xdist's own hooks, a worker's spool
(``report/spool.py``) named in ``pytest_configure_node``. A run that is active and
writes a report writes it however it ends once this plugin has configured it: a signal
(``processes.interrupts``), a closed stdout (``processes.closed_stdout``), an interruption
before the session even started.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config import combinations, options
from pytest_sharedkv.config.markers import GPU_MARKER, MarkerError, is_gated
from pytest_sharedkv.config.markers import register as register_markers
from pytest_sharedkv.config.tiers import (
    FIXTURE_PREFIX,
    in_shipped_suite,
    is_sharedkv_item,
    is_sharedkv_mark,
    tier_of,
)
from pytest_sharedkv.processes import interrupts
from pytest_sharedkv.report.fields import (
    REPORT_TIER,
    REQUIRE_GPU_FLAG,
    SPOOLED_ATTRIBUTE,
    USER_PROPERTY,
    add_params,
)
from pytest_sharedkv.state import (
    STATE,
    WORKER_RECORDS_RUN,
    WORKER_USAGE_ERROR,
    RunState,
    state_of,
)

if TYPE_CHECKING:
    from pytest_sharedkv.config.gating import Gate
    from pytest_sharedkv.host.leases import Lease
    from pytest_sharedkv.host.lmcache_status import LMCacheStatus
    from pytest_sharedkv.report.records import Bundle, ResultSink
    from pytest_sharedkv.report.spool import Spool
# The tiers' pytest modules (fixtures, matrix generation, tier tables), registered by module
# name when the run first needs them (load_tiers). Not ``pytest_plugins``: pytest looks each
# of its names up among every installed distribution's entry points first, a scan per name.
TIER_PLUGINS = (
    "pytest_sharedkv.ordering.fixtures",
    "pytest_sharedkv.packed_page.fixtures",
    "pytest_sharedkv.pinned_pool.fixtures",
    "pytest_sharedkv.stack.fixtures",
    "pytest_sharedkv.replica_pair.fixtures",
    "pytest_sharedkv.service.fixtures",
    "pytest_sharedkv.perf.fixtures",
    "pytest_sharedkv.identity.fixtures",
)
TIERS_LOADED = pytest.StashKey[bool]()
# A tier's configure refused the run while collection registered the tiers; said as the
# usage error once the collected items are known (raised inside collection, pytest would
# report it as a collection error of one module).
TIER_PROBLEM = pytest.StashKey[str]()
TIER_LOADER = "sharedkv-tier-loader"
COLLECTOR = "sharedkv-collector"
# Whether a collector (module, class) carries a sharedkv marker or is in the shipped suite.
SHAREDKV_NODE = pytest.StashKey[bool]()

ITEM_BUNDLE: pytest.StashKey[Bundle] = pytest.StashKey()
ITEM_TIER: pytest.StashKey[str | None] = pytest.StashKey()
# The gate skipped this item at setup: its report points at the test, not at gating.py.
ITEM_GATE_SKIPPED: pytest.StashKey[bool] = pytest.StashKey()
# lmcache's import pulls in OpenTelemetry, whose deprecation noise drowns the summary; the
# filter goes on sharedkv items only, never on a project's own tests.
OTEL_FILTER = "ignore:.*LoggingHandler.*opentelemetry:DeprecationWarning"
REQUIRE_GPU_TAG = "[--sharedkv-require-gpu: a GPU/lmcache/vllm-gated test may not skip]"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_sharedkv import hookspecs
    pluginmanager.add_hookspecs(hookspecs)


def load_tiers(config: pytest.Config) -> None:
    """Register the tiers' pytest modules, once (``-p no:NAME`` still blocks one): in every
    pytest start they were most of what the plugin cost a project without sharedkv tests."""
    if config.stash.get(TIERS_LOADED, False):
        return
    config.stash[TIERS_LOADED] = True
    loader = config.pluginmanager.get_plugin(TIER_LOADER)
    if loader is not None:
        config.pluginmanager.unregister(loader)
    problem: pytest.UsageError | None = None
    for name in TIER_PLUGINS:  # a tier's configure may refuse the run: register them all
        try:
            config.pluginmanager.import_plugin(name)
        except pytest.UsageError as exc:
            problem = problem or exc
    if problem is not None:
        raise problem


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """A run given a sharedkv option or ini value has the tiers before its conftests and
    before the command line's own hooks (``--sharedkv-list-targets``)."""
    if options.asked(early_config):
        load_tiers(early_config)


class _TierLoader:
    """Registers the tiers when collection first meets a function that may need them: one
    that carries a sharedkv marker (its own, its class's or its module's), lives in the
    shipped suite, or names a ``sharedkv_`` fixture among its arguments. The tiers
    parametrize only such functions; a plugin fixture asked for through a user's fixture is
    found at setup, once the collected items have made the run active."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makeitem(self, collector: pytest.Collector, name: str,
                                  obj: object) -> None:
        function = getattr(obj, "__func__", obj)  # a staticmethod or classmethod in a class
        if type(function) is types.FunctionType and (
                _asks_for_sharedkv(function) or _sharedkv_node(collector)):
            try:
                load_tiers(self.config)
            except pytest.UsageError as exc:
                self.config.stash[TIER_PROBLEM] = str(exc)


def _asks_for_sharedkv(function: types.FunctionType) -> bool:
    """FUNCTION names a sharedkv_ fixture as an argument or carries a sharedkv marker."""
    target: object = function
    if hasattr(function, "__wrapped__"):
        import inspect

        target = inspect.unwrap(function)
    code = getattr(target, "__code__", None)
    if code is not None and any(name.startswith(FIXTURE_PREFIX) for name in
                                code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]):
        return True
    return any(is_sharedkv_mark(mark) for mark in getattr(function, "pytestmark", ()))


def _sharedkv_node(collector: pytest.Collector) -> bool:
    """COLLECTOR (a module or class) carries a sharedkv marker or is in the shipped suite;
    worked out once per collector."""
    found = collector.stash.get(SHAREDKV_NODE, None)
    if found is None:
        found = (any(is_sharedkv_mark(mark) for mark in collector.iter_markers())
                 or in_shipped_suite(collector.path))
        collector.stash[SHAREDKV_NODE] = found
    return found


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)
    settings = combinations.load_settings(config)
    state = RunState(settings=settings, is_worker=hasattr(config, "workerinput"),
                     active=options.given(settings))
    config.stash[STATE] = state
    if state.active:
        load_tiers(config)
        _check_settings_environment(config)
    elif not config.stash.get(TIERS_LOADED, False):
        config.pluginmanager.register(_TierLoader(config), TIER_LOADER)
    if state.is_worker:
        run = config.workerinput.get(WORKER_RECORDS_RUN)  # type: ignore[attr-defined]
        state.records_run = run if isinstance(run, str) else None
        if state.active:
            _die_with_controller(config)
        return
    config.pluginmanager.register(_Collector(config, state), COLLECTOR)
    if state.active:
        # Under xdist the controller collects nothing, so it is told here (or by the first
        # sharedkv report, see _Collector): SIGTERM must reach its report writing too.
        _install_interrupts(config)
        _guard_stdout(config)
        _check_devices(config)


def _check_settings_environment(config: pytest.Config) -> None:
    """What an active run reads from its environment besides devices, and where the report
    goes: a bad value is a usage error before any test."""
    problem = _environment_problem()
    if problem is not None:
        raise pytest.UsageError(problem)
    settings = state_of(config).settings
    if settings.json is not None and not state_of(config).is_worker:
        from pytest_sharedkv.report import json_report
        problem = json_report.check_writable(settings.json)
        if problem is not None:
            raise pytest.UsageError(f"{settings.source_of('json')}: cannot write the report "
                                    f"to {settings.json}: {problem}")


def _environment_problem() -> str | None:
    """A bad SHAREDKV_SERVICE_MEASURED or SHAREDKV_RUNTIME_DIR, read only once the run is
    active: in anybody else's run they are nobody's business."""
    try:
        options.measured_limit()
    except options.OptionError as exc:
        return str(exc)
    from pytest_sharedkv.host.runtime_dir import chosen_problem

    problem = chosen_problem()
    if problem is not None:
        return (f"{problem} (it names the directory every run on this machine shares for "
                "GPU leases and launch records)")
    return None


def _guard_stdout(config: pytest.Config) -> None:
    """A run that writes a report ends as an interrupt, report written, when its stdout's
    reader goes away; installed before pytest's terminal reporter takes sys.stdout."""
    state = state_of(config)
    if state.settings.json is None or state.stdout_guard is not None:
        return
    from pytest_sharedkv.processes.closed_stdout import REASON, GuardedStdout

    def closed() -> None:
        if not state.session_done:
            interrupts.interrupt(config, REASON)

    state.stdout_guard = GuardedStdout(sys.stdout, closed)
    sys.stdout = state.stdout_guard


def _install_interrupts(config: pytest.Config) -> None:
    """SIGTERM as Ctrl-C; an xdist controller passes it, and SIGINT, on to its workers."""
    def workers() -> list[int]:
        from pytest_sharedkv.processes import xdist_workers
        return xdist_workers.pids(config)

    interrupts.install(config, forward=workers, worker=state_of(config).is_worker)


PDEATHSIG = pytest.StashKey[bool]()


def _die_with_controller(config: pytest.Config) -> None:
    """An xdist worker of an active run dies with the controller, however the controller
    died: execnet alone lets a worker sleeping in a test outlive a killed controller by
    seconds. SIGKILL, not SIGTERM: with the controller gone nothing the worker reports can
    arrive, what it launched is stopped by its supervisors (they watch the controller too),
    its leases are locks the kernel drops; the Ctrl-C path would only spend seconds
    formatting a traceback for nobody. Only where sharedkv is in use: in anybody else's
    run a worker keeps xdist's own behaviour."""
    if PDEATHSIG not in config.stash:
        import signal

        from pytest_sharedkv.processes.supervise import die_with_parent
        config.stash[PDEATHSIG] = die_with_parent(signal.SIGKILL)


def _device_problem(config: pytest.Config) -> str | None:
    """A bad device variable, or --sharedkv-gpus naming an absent device (runs discovery)."""
    from pytest_sharedkv.host.devices import environment_problem
    problem = environment_problem()
    if problem is None and state_of(config).settings.gpus is not None:
        discovery = gate_of(config).discovery
        if isinstance(discovery, str):
            problem = discovery
    return problem


def _check_devices(config: pytest.Config) -> None:
    problem = _device_problem(config)
    if problem is not None:
        raise pytest.UsageError(problem)


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sharedkv = [item for item in items if is_sharedkv_item(item)]
    if not sharedkv:
        return
    for item in sharedkv:
        item.add_marker(pytest.mark.filterwarnings(OTEL_FILTER))
    # From here on SIGTERM (a CI time limit) tears the run down as Ctrl-C does.
    _install_interrupts(config)
    state = state_of(config)
    if state.is_worker:
        _die_with_controller(config)
        from pytest_sharedkv.config import xdist_groups
        if xdist_groups.grouping_lost(config, sharedkv):
            config.workeroutput[xdist_groups.LOST] = True  # type: ignore[attr-defined]
    problem = config.stash.get(TIER_PROBLEM, None)
    if state.active and problem is None:
        return
    state.active = True
    if problem is None:
        try:
            load_tiers(config)
        except pytest.UsageError as exc:
            problem = str(exc)
    problem = problem or _environment_problem() or _device_problem(config)
    if problem is None:
        return
    if state.is_worker:
        config.workeroutput[WORKER_USAGE_ERROR] = problem  # type: ignore[attr-defined]
        items[:] = []
        return
    raise pytest.UsageError(problem)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist controller: a worker is down (no signal is passed on to it any more); it found
    the environment unusable (see above), or saw --dist loadgroup not group its pair tests
    (config.xdist_groups)."""
    from pytest_sharedkv.processes import xdist_workers
    xdist_workers.forget(node)
    output = getattr(node, "workeroutput", {})
    problem = output.get(WORKER_USAGE_ERROR)
    if problem:
        raise pytest.UsageError(problem)
    from pytest_sharedkv.config import xdist_groups
    state = state_of(node.config)
    if output.get(xdist_groups.LOST) and _grouping_fact(state) is None:
        from pytest_sharedkv.report.records import Fact  # the JSON's fact; the summary's NOTE
        state.log.bundle.facts.append(Fact(name=xdist_groups.FACT, value=_grouping_note()))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller, as it sets up a worker on this machine: the run's directory the
    worker spools its records to (``report/spool.py``), by name, from xdist's testrunuid;
    nothing is made here, only by a worker's first record."""
    if not getattr(node.gateway.spec, "popen", False):
        return
    state = state_of(node.config)
    if state.records_run is None:  # the controller's pid, for a person reading the directory
        run = node.workerinput.get("testrunuid") or f"{id(node.config):x}"
        state.records_run = f"{os.getpid()}-{run}"
    node.workerinput[WORKER_RECORDS_RUN] = state.records_run


def _spool_of(config: pytest.Config) -> Spool | None:
    """An xdist worker's spool (none elsewhere, nor where the controller named no place)."""
    state = state_of(config)
    if state.spool is None and state.is_worker and state.records_run is not None:
        from pytest_sharedkv.report.spool import Spool
        state.spool = Spool(state.records_run, os.environ.get("PYTEST_XDIST_WORKER", "gw"))
    return state.spool


def _merge_spooled(config: pytest.Config, wait: bool) -> None:
    """xdist controller: the records workers spooled that no report brought (a test
    interrupted mid-call, a report still on its way), into the run's log, each once; with
    WAIT (an interrupted run) once the workers it knows have written their last."""
    state = state_of(config)
    if state.is_worker or state.records_run is None or not (state.active or state.has_log):
        return  # no sharedkv test reported, nor was an option given: nothing was spooled
    from pytest_sharedkv.host.runtime_dir import RuntimeDirError
    from pytest_sharedkv.report import spool
    try:
        directory = spool.directory(state.records_run)
    except (OSError, RuntimeDirError):
        return  # a worker could not spool either
    if wait:
        from pytest_sharedkv.processes import xdist_workers
        spool.wait_for_workers(directory, xdist_workers.known(config))
    if directory.is_dir() and spool.merge(state.log, directory):
        state.active = True  # a worker made sharedkv records


def _grouping_fact(state: RunState) -> str | None:
    """The run's recorded note that --dist loadgroup did not group, if a worker saw it."""
    if not state.has_log:
        return None
    from pytest_sharedkv.config import xdist_groups
    return next((f.value for f in state.log.bundle.facts if f.name == xdist_groups.FACT), None)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The report of a run that ended before its session finished (an interrupt while xdist
    started its workers, in a plugin's configure), then what the run installed goes."""
    state = config.stash.get(STATE, None)
    if state is not None and not state.is_worker:
        if state.active and state.settings.json is not None and state.json_written is None:
            _write_unfinished(config, state)
        if state.records_run is not None and (state.active or state.has_log):
            from pytest_sharedkv.report import spool  # the workers are down by now
            spool.remove(state.records_run)
        if state.stdout_guard is not None:
            state.stdout_guard.flush()  # what a closed pipe was still owed goes to /dev/null
            if sys.stdout is state.stdout_guard:
                sys.stdout = state.stdout_guard.stream
    collector = config.pluginmanager.get_plugin(COLLECTOR)
    if collector is not None:
        config.pluginmanager.unregister(collector)
    loader = config.pluginmanager.get_plugin(TIER_LOADER)
    if loader is not None:
        config.pluginmanager.unregister(loader)
    interrupts.restore(config)


def _write_unfinished(config: pytest.Config, state: RunState) -> None:
    """Write the report of a run whose session never finished, and say where it went."""
    assert state.settings.json is not None
    from pytest_sharedkv.report import json_report

    _merge_spooled(config, wait=True)
    log = state.log
    log.interrupted = log.interrupted or "the run ended before its session finished"
    data = json_report.build(log, _environment_data(config, probe=False),
                             int(pytest.ExitCode.INTERRUPTED), complete=True)
    state.json_written = json_report.write_or_fallback(
        state.settings.json, data, named_by=state.settings.source_of("json"))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(state.json_written)


def gate_of(config: pytest.Config) -> Gate:
    state = state_of(config)
    if state.gate is None:
        from pytest_sharedkv.config.gating import Gate, worker_id
        state.gate = Gate(state.settings, owner=worker_id())
    return state.gate


def _environment_lines(config: pytest.Config) -> list[str]:
    state = state_of(config)
    if state.header is None:
        from pytest_sharedkv.host import environment
        state.header, state.lmcache = environment.header(config, gate_of(config).discovery)
        state.header = state.header + _engine_lines(state.settings)
    return state.header


def _engine_lines(settings: options.Settings | None) -> list[str]:
    """--sharedkv-engine sglang: the engine and what its tiers cannot judge, said before
    the run (the KV audit: n/a)."""
    from pytest_sharedkv.config.engine import Engine

    if settings is None or settings.engine is Engine.VLLM:
        return []
    from pytest_sharedkv.host.environment import dist_version
    from pytest_sharedkv.stack.launch.sglang_dialect import KV_AUDIT

    version = dist_version("sglang")
    return [f"sharedkv: engine sglang {version or 'not installed'} (replicas over one "
            f"LMCache MP server through SGLang's LMCache radix cache); KV audit {KV_AUDIT}"]


def lmcache_status_of(config: pytest.Config) -> LMCacheStatus | str:
    """LMCache's version and kernel path in this run (probed once, in a child)."""
    state = state_of(config)
    _environment_lines(config)
    assert state.lmcache is not None
    return state.lmcache


def _show_header(config: pytest.Config) -> list[str]:
    state = state_of(config)
    if not state.active or state.header_shown or state.is_worker:
        return []
    state.header_shown = True
    return _environment_lines(config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _show_header(config)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """The header, once sharedkv items are known (a run that gave no sharedkv option)."""
    return _show_header(config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if is_gated(item):
        try:
            gate_of(item.config).setup(item)
        except MarkerError as exc:
            pytest.fail(str(exc), pytrace=False)
        except pytest.skip.Exception:
            item.stash[ITEM_GATE_SKIPPED] = True
            raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        state = state_of(item.config)
        if state.gate is not None:
            from pytest_sharedkv.config.gating import ITEM_LEASE
            if ITEM_LEASE in item.stash:
                state.gate.teardown(item)


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr)


def _item_location(item: pytest.Item) -> tuple[str, int]:
    """Where pytest's skip summary (``-ra``) should point: the test, as for a skip mark."""
    path, line = item.reportinfo()[:2]
    return os.fspath(path), (line or 0) + 1


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, object, object]:
    """A test interrupted mid-call (Ctrl-C, or SIGTERM turned into one) gets no report, so
    the records it wrote so far would ride on none: they go straight into the run's log,
    and the report written at the end keeps them (the catalogue and the triage flush each
    cell as it is judged; this keeps what any test recorded and did not flush). An xdist
    worker spools them instead (``report/spool.py``), for the controller to merge."""
    try:
        return (yield)
    except BaseException:
        bundle = item.stash.get(ITEM_BUNDLE, None)
        state = state_of(item.config)
        spool = _spool_of(item.config) if bundle else None
        if bundle and (spool is not None or (state.has_log and not state.is_worker)):
            from pytest_sharedkv.report.records import Bundle
            if spool is not None:
                spool.write(item.nodeid, _tier(item), bundle, interrupted=True)
                spool.reported()  # no report will carry them
            else:
                state.log.bundle.extend(bundle)
            item.stash[ITEM_BUNDLE] = Bundle()
        raise


def _tier(item: pytest.Item) -> str | None:
    if ITEM_TIER not in item.stash:
        item.stash[ITEM_TIER] = tier_of(item)
    return item.stash[ITEM_TIER]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    tier = _tier(item)
    if tier is not None:
        setattr(report, REPORT_TIER, tier)  # the controller's only source for the tier
        add_params(report, item)  # what it ran, by name: compare matches tests by it
    state = state_of(item.config)
    if state.is_worker and state.active:  # for the controller to pass a signal on to it
        from pytest_sharedkv.processes import xdist_workers
        xdist_workers.mark(report)
    bundle = item.stash.get(ITEM_BUNDLE, None)
    if bundle:
        from pytest_sharedkv.report.records import Bundle
        # A fresh list: report.user_properties is item.user_properties, shared by all phases.
        report.user_properties = [*report.user_properties, (USER_PROPERTY, bundle.to_data())]
        item.stash[ITEM_BUNDLE] = Bundle()
        spooled = state.spool.reported() if state.spool is not None else []
        if spooled:  # an xdist worker also spooled these: the controller keeps them once
            setattr(report, SPOOLED_ATTRIBUTE, spooled)
    if (call.when == "setup" and report.skipped and isinstance(report.longrepr, tuple)
            and item.stash.get(ITEM_GATE_SKIPPED, False)):
        report.longrepr = (*_item_location(item), report.longrepr[2])
    settings = state.settings
    if (settings.require_gpu and report.skipped and not hasattr(report, "wasxfail")
            and is_gated(item)):
        reason = _skip_reason(report)
        report.outcome = "failed"
        report.longrepr = f"{reason}\n{REQUIRE_GPU_TAG}"
        setattr(report, REQUIRE_GPU_FLAG, reason)
    return report


def pytest_report_teststatus(report: pytest.TestReport | pytest.CollectReport
                             ) -> tuple[str, str, str] | None:
    """A gated skip failed by --sharedkv-require-gpu is a failure, also at setup (where
    pytest would call any failed report an error), as the README promises."""
    if getattr(report, REQUIRE_GPU_FLAG, None):
        return "failed", "F", "FAILED"
    return None


class _Collector:
    """Folds test reports into the run log; registered only where the run is owned.

    Reports reach ``pytest_runtest_logreport`` in the process that ran the test and, under
    xdist, again on the controller; the controller (or a run without xdist) keeps the log.
    Until the run is active only sharedkv reports are kept (under xdist the controller
    learns of sharedkv items from their reports). With ``--sharedkv-json`` the report is
    also rewritten (``"complete": false``) after a failure and at most every few seconds
    otherwise, so a run killed by a time limit (a GPU box's per-call cap) still leaves what
    it found; and when a running test hands its records over early (``deliver``).
    """

    PARTIAL_EVERY_S = 5.0

    def __init__(self, config: pytest.Config, state: RunState) -> None:
        self.config = config
        self.state = state
        self.last_write = time.monotonic()
        self.environment: dict[str, Any] | None = None

    def _category(self, report: pytest.TestReport) -> str:
        status = self.config.hook.pytest_report_teststatus(report=report, config=self.config)
        return str(status[0]) if status else ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.state
        if not (state.active or getattr(report, REPORT_TIER, None)
                or any(name == USER_PROPERTY for name, _ in report.user_properties)
                or (state.has_log and report.nodeid in state.log.tests)):
            return
        state.log.add_report(report, self._category(report))
        from pytest_sharedkv.processes import xdist_workers
        xdist_workers.remember(self.config, report)
        _install_interrupts(self.config)  # under xdist, the first news of sharedkv items
        load_tiers(self.config)  # the tier tables of the summary
        path = state.settings.json
        if path is None or (report.when != "teardown" and not report.failed):
            return
        now = time.monotonic()
        if report.failed or now - self.last_write >= self.PARTIAL_EVERY_S:
            self.last_write = now
            self._write_partial(path)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if self.state.active and not report.passed:
            self.state.log.add_collect_report(report, "error" if report.failed else "skipped")

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        if not (self.state.active or self.state.has_log):
            return
        message = str(excinfo.value).strip()
        name = excinfo.typename
        self.state.log.interrupted = f"{name}: {message}" if message else name

    def deliver(self, bundle: Bundle) -> bool:
        """A running test's records, before its report (``ResultSink.flush``): into the
        run's log now, the JSON report rewritten with them. False where the run is not
        active (they go with the test's report then)."""
        if not self.state.active:
            return False
        self.state.log.bundle.extend(bundle)
        path = self.state.settings.json
        if path is not None:
            self.last_write = time.monotonic()
            self._write_partial(path)
        return True

    def _write_partial(self, path: Path) -> None:
        from pytest_sharedkv.report import json_report
        if self.environment is None:
            self.environment = _environment_data(self.config)
        data = json_report.build(self.state.log, self.environment, None)
        with contextlib.suppress(OSError):  # the final write falls back and says so
            json_report.write(path, data)


def _environment_data(config: pytest.Config, probe: bool = True) -> dict[str, Any]:
    """The report's environment; without PROBE (a run interrupted before its header was
    made) no device discovery or LMCache probe is started for it."""
    from pytest_sharedkv.host.environment import lmcache_data

    state = state_of(config)
    if probe or state.header is not None:
        header, lmcache = _environment_lines(config), lmcache_status_of(config)
    else:
        header, lmcache = [], "not checked: the run ended before its header was made"
    return {"header": header, "lmcache": lmcache_data(lmcache), "settings": {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(state.settings).items() if k != "sources"
    }}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = state_of(session.config)
    state.session_done = True  # a stdout closed from here on is only silenced
    if state.is_worker:
        if state.active and state.records_run is not None:
            from pytest_sharedkv.report.spool import finished
            finished(state.records_run, os.environ.get("PYTEST_XDIST_WORKER", "gw"))
        return
    _merge_spooled(session.config, wait=exitstatus == pytest.ExitCode.INTERRUPTED)
    if not (state.has_log or (state.active and state.settings.json)):
        return
    log = state.log  # an active run that ends before any report still writes its report
    if log.interrupted is None:
        stopped = session.shouldfail or session.shouldstop  # -x, --maxfail, a plugin's stop
        if stopped:
            log.interrupted = str(stopped)
        elif exitstatus == pytest.ExitCode.INTERRUPTED:
            log.interrupted = "interrupted"
    if log.perf is None and log.interrupted is not None:  # nothing measured is lost
        from pytest_sharedkv.report.run_log import unreported_perf
        log.perf = unreported_perf(session.items)
    if state.settings.json is None:
        return
    from pytest_sharedkv.report import json_report
    data = json_report.build(log, _environment_data(session.config), int(exitstatus),
                             complete=True)
    state.json_written = json_report.write_or_fallback(
        state.settings.json, data, named_by=state.settings.source_of("json"))


def _grouping_note() -> str:
    from importlib import metadata

    from pytest_sharedkv.config import xdist_groups

    try:
        xdist = metadata.version("pytest-xdist")
    except metadata.PackageNotFoundError:
        xdist = "?"
    return xdist_groups.note(pytest.__version__, xdist)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    state = state_of(config)
    if state.is_worker:
        return
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        from pytest_sharedkv.config.tiers import unselected_tier_lines
        for line in unselected_tier_lines(config.getoption("markexpr", "") or ""):
            terminalreporter.write_line(line, yellow=True)
    if not state.has_log:
        return
    from pytest_sharedkv.report import terminal
    reports = {r.tier: r for r in config.hook.pytest_sharedkv_tier_report(config=config)
               if r is not None}
    lines = terminal.summary_lines(state.log, reports)
    if lines:
        terminalreporter.section("sharedkv summary")
        if not state.header_shown:  # an xdist run that gave no sharedkv option
            state.active = state.header_shown = True
            for line in _environment_lines(config):
                terminalreporter.write_line(line)
            terminalreporter.write_line("")
        for line in lines:
            terminalreporter.write_line(line)
    grouping = _grouping_fact(state)
    if grouping is not None:
        terminalreporter.write_line(grouping, yellow=True)
    if state.json_written is not None:
        bad = not state.json_written.startswith("JSON report: ")
        terminalreporter.write_line(state.json_written, red=bad, bold=bad)


# -- core fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sharedkv_settings(pytestconfig: pytest.Config) -> options.Settings:
    """The run's validated settings (options and their ini twins)."""
    return state_of(pytestconfig).settings


@pytest.fixture
def sharedkv_results(request: pytest.FixtureRequest) -> ResultSink:
    """Add check records, notes and facts; they reach the tables and the JSON report."""
    from pytest_sharedkv.report.records import Bundle, ResultSink
    item = request.node
    bundle = item.stash.setdefault(ITEM_BUNDLE, Bundle())
    # the process that keeps the run's log takes records before the report (flush); an
    # xdist worker's go with the test's report, and are spooled as they are flushed
    collector = request.config.pluginmanager.get_plugin(COLLECTOR)
    deliver: Callable[[Bundle], bool] | None = (
        collector.deliver if isinstance(collector, _Collector)
        and not state_of(request.config).is_worker else None)
    spool = _spool_of(request.config)
    if deliver is None and spool is not None:
        def spooled(held: Bundle) -> bool:
            assert spool is not None
            spool.write(item.nodeid, _tier(item), held)
            return False  # they stay for the test's report, which names them spooled
        deliver = spooled
    return ResultSink(item.nodeid, bundle, deliver)


@pytest.fixture
def sharedkv_gpu_lease(request: pytest.FixtureRequest) -> Lease:
    """The devices leased for this test (mark it ``@pytest.mark.sharedkv_gpu(count=N)``).

    ``lease.env()`` gives the CUDA_VISIBLE_DEVICES for subprocesses that should use them.
    """
    from pytest_sharedkv.config.gating import ITEM_LEASE
    lease: Lease | None = request.node.stash.get(ITEM_LEASE, None)
    if lease is None:
        pytest.fail(
            f"sharedkv_gpu_lease needs @pytest.mark.{GPU_MARKER}(count=N) on the test",
            pytrace=False,
        )
    return lease


@pytest.fixture(scope="session")
def sharedkv_lmcache_status(pytestconfig: pytest.Config) -> LMCacheStatus | str:
    """LMCache's version and kernel path (compiled, torch fallback, unknown), as the header
    says it; a line saying why when it was not checked."""
    return lmcache_status_of(pytestconfig)
