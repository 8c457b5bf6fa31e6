"""The pytest entry point (``pytest11: sharedkv``): hooks and the core fixtures, nothing heavy.

Loading this module must not import torch, lmcache or vllm; tiers import them inside the
fixtures that need them. Run state lives in ``config.stash``. Nothing here depends on
xdist: records cross from workers to the controller on ``user_properties``, which xdist
serialises, so ``-p no:xdist`` behaves the same.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv import environment, interrupts, options, report_json, report_terminal
from pytest_sharedkv.devices import Discovery
from pytest_sharedkv.gating import ITEM_LEASE, Gate, worker_id
from pytest_sharedkv.leases import Lease
from pytest_sharedkv.markers import GPU_MARKER, TIER_MARKERS, MarkerError, is_gated
from pytest_sharedkv.markers import register as register_markers
from pytest_sharedkv.records import USER_PROPERTY, Bundle, ResultSink
from pytest_sharedkv.run_log import RunLog
from pytest_sharedkv.runtime_dir import chosen_problem
from pytest_sharedkv.state import STATE, RunState, state_of

# The tiers' pytest modules (fixtures, matrix generation), loaded with this plugin.
pytest_plugins = [
    "pytest_sharedkv.ordering.fixtures",
    "pytest_sharedkv.layouts.fixtures",
    "pytest_sharedkv.pool.fixtures",
    "pytest_sharedkv.replicas.fixtures",
]

ITEM_BUNDLE = pytest.StashKey[Bundle]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_sharedkv import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)
    # lmcache's import pulls in OpenTelemetry, whose deprecation noise drowns the summary.
    config.addinivalue_line(
        "filterwarnings", "ignore:.*LoggingHandler.*opentelemetry:DeprecationWarning")
    settings = options.load_settings(config)
    problem = chosen_problem()
    if problem is not None:
        raise pytest.UsageError(f"{problem} (it names the directory every run on this machine "
                                "shares for GPU leases and launch records)")
    if settings.json is not None:
        problem = report_json.check_writable(settings.json)
        if problem is not None:
            raise pytest.UsageError(f"{settings.sources['json']}: cannot write {problem}")
    state = RunState(settings=settings, is_worker=hasattr(config, "workerinput"))
    config.stash[STATE] = state
    if not state.is_worker:
        config.pluginmanager.register(_Collector(config, state.log), "sharedkv-collector")


def uses_sharedkv(item: pytest.Item) -> bool:
    """A tier or need marker, or a fixture of this plugin."""
    if is_gated(item) or any(item.get_closest_marker(m) for m in TIER_MARKERS):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        for fixturedef in defs:
            module = getattr(getattr(fixturedef, "func", None), "__module__", "") or ""
            if module.startswith("pytest_sharedkv."):
                return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # From here on SIGTERM (a CI time limit) tears the run down as Ctrl-C does.
    if any(uses_sharedkv(item) for item in items):
        interrupts.install(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    interrupts.restore(config)


def gate_of(config: pytest.Config) -> Gate:
    state = state_of(config)
    if state.gate is None:
        state.gate = Gate(state.settings, owner=worker_id())
    return state.gate


def _environment_lines(config: pytest.Config) -> list[str]:
    state = state_of(config)
    if state.header is None:
        discovery: Discovery | str = gate_of(config).discovery
        state.header = environment.header_lines(config, discovery)
    return state.header


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _environment_lines(config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if is_gated(item):
        try:
            gate_of(item.config).setup(item)
        except MarkerError as exc:
            pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        if ITEM_LEASE in item.stash:
            gate_of(item.config).teardown(item)


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    bundle = item.stash.get(ITEM_BUNDLE, None)
    if bundle:
        # A fresh list: report.user_properties is item.user_properties, shared by all phases.
        report.user_properties = [*report.user_properties, (USER_PROPERTY, bundle.to_data())]
        item.stash[ITEM_BUNDLE] = Bundle()
    settings = state_of(item.config).settings
    if (settings.require_gpu and report.skipped and not hasattr(report, "wasxfail")
            and is_gated(item)):
        report.outcome = "failed"
        report.longrepr = (
            f"{_skip_reason(report)}\n"
            "[--sharedkv-require-gpu: a GPU/lmcache/vllm-gated test may not skip]"
        )
    return report


class _Collector:
    """Folds test reports into the run log; registered only where the run is owned.

    Reports reach ``pytest_runtest_logreport`` in the process that ran the test and, under
    xdist, again on the controller; the controller (or a run without xdist) keeps the log.
    With ``--sharedkv-json`` the report is also rewritten (``"complete": false``) after a
    failure and at most every few seconds otherwise, so a run killed by a time limit (a GPU
    box's per-call cap) still leaves what it found.
    """

    PARTIAL_EVERY_S = 5.0

    def __init__(self, config: pytest.Config, log: RunLog) -> None:
        self.config = config
        self.log = log
        self.last_write = time.monotonic()
        self.environment: dict[str, Any] | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.log.add_report(report)
        path = state_of(self.config).settings.json
        if path is None or (report.when != "teardown" and not report.failed):
            return
        now = time.monotonic()
        if report.failed or now - self.last_write >= self.PARTIAL_EVERY_S:
            self.last_write = now
            if self.environment is None:
                self.environment = _environment_data(self.config)
            data = report_json.build(self.log, self.environment, None)
            with contextlib.suppress(OSError):  # the final write falls back and says so
                report_json.write(path, data)


def _environment_data(config: pytest.Config) -> dict[str, Any]:
    return {"header": _environment_lines(config), "settings": {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(state_of(config).settings).items() if k != "sources"
    }}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = state_of(session.config)
    if state.is_worker or state.settings.json is None:
        return
    data = report_json.build(state.log, _environment_data(session.config), int(exitstatus),
                             complete=True)
    state.json_written = report_json.write_or_fallback(state.settings.json, data)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    state = state_of(config)
    if state.is_worker:
        return
    lines = report_terminal.summary_lines(state.log)
    if lines:
        terminalreporter.section("sharedkv summary")
        for line in lines:
            terminalreporter.write_line(line)
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
    item = request.node
    bundle = item.stash.setdefault(ITEM_BUNDLE, Bundle())
    return ResultSink(item.nodeid, bundle)


@pytest.fixture
def sharedkv_gpu_lease(request: pytest.FixtureRequest) -> Lease:
    """The devices leased for this test (mark it ``@pytest.mark.sharedkv_gpu(count=N)``).

    ``lease.env()`` gives the CUDA_VISIBLE_DEVICES for subprocesses that should use them.
    """
    lease: Lease | None = request.node.stash.get(ITEM_LEASE, None)
    if lease is None:
        pytest.fail(
            f"sharedkv_gpu_lease needs @pytest.mark.{GPU_MARKER}(count=N) on the test",
            pytrace=False,
        )
    return lease
