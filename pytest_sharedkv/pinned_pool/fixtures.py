"""The pinned_pool tier's pytest side: the ``sharedkv_pinned_pool`` session fixture and its
checks. Registered by the main plugin, so module-level imports stay light (the budget
ledger, child runner and predictions load with the fixture).

``sharedkv_pinned_pool.route(name)`` allocates a pool of ``--sharedkv-pool-gib`` through one route
in a child process (after reserving its predicted size in the run's host budget), then
judges it: every sampled page pinned, no pageable-fallback warning, reserved within 1% of
what was asked. Results are cached per route for the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.pinned_pool.budget import HostBudget, Reservation
    from pytest_sharedkv.pinned_pool.child import ChildResult
    from pytest_sharedkv.report.records import ResultSink
    from pytest_sharedkv.report.terminal import TierReport
TIER = "pinned_pool"
BUDGET_DIR = "host-budget"  # under the runtime dir
WASTE_LIMIT = 1.01
ROUND_KEY = "pinned_max_round_threshold_mb"
CACHE_KEY = "pinned_max_cached_size_mb"


@dataclass
class RouteReport:
    route: str
    requested: int
    problems: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    skip: str | None = None

    @property
    def ok(self) -> bool:
        return self.skip is None and not self.problems


class PinnedPool:
    """Allocates pools through each route, one child process at a time per worker."""

    def __init__(self, nbytes: int, budget: HostBudget, timeout: float) -> None:
        self.nbytes = nbytes
        self.budget = budget
        self.timeout = timeout
        self._routes: dict[str, RouteReport] = {}
        self._conf: dict[str, ChildResult] = {}

    def _child(self, what: str, args: list[str], alloc_conf: str | None, reserve: int
               ) -> ChildResult | str:
        from pytest_sharedkv.pinned_pool.child import child_env, run_child, worker_argv

        reservation: Reservation | str = self.budget.reserve(reserve, what, wait_s=60.0)
        if isinstance(reservation, str):
            return reservation
        try:
            return run_child(worker_argv(*args), child_env(alloc_conf), self.timeout, what)
        finally:
            reservation.release()

    def route(self, route: str, nbytes: int | None = None, alloc_conf: str | None = None
              ) -> RouteReport:
        from pytest_sharedkv.pinned_pool.child import HOST_REGISTER_CONF
        from pytest_sharedkv.pinned_pool.predict import gib, predicted_reservation

        n = nbytes or self.nbytes
        conf = alloc_conf if alloc_conf is not None else (
            HOST_REGISTER_CONF if route == "torch-host-register" else None)
        key = f"{route}:{n}:{conf}"
        if key in self._routes:
            return self._routes[key]
        report = RouteReport(route, n)
        threshold = _threshold_bytes(conf)
        predicted = predicted_reservation(route, n, threshold)
        report.data["predicted"] = predicted
        child = self._child(f"{route} pool of {gib(n)}", [route, str(n)], conf, predicted)
        if isinstance(child, str):
            report.skip = f"{child} (predicted reservation {gib(predicted)} for {gib(n)} asked)"
        elif child.data is None:
            report.problems.append(f"{child.error}; stderr: {' | '.join(child.stderr_tail)}")
        else:
            report.data.update(child.data)
            report.data["fallback_warnings"] = child.fallback_warnings
            _judge(report, child)
        self._routes[key] = report
        return report

    def conf_accepted(self, conf: str) -> ChildResult:
        from pytest_sharedkv.pinned_pool.child import child_env, run_child, worker_argv

        if conf not in self._conf:
            self._conf[conf] = run_child(worker_argv("probe-conf"), child_env(conf), 300,
                                         f"PYTORCH_CUDA_ALLOC_CONF={conf}")
        return self._conf[conf]

    def hazard(self, conf: str) -> ChildResult:
        from pytest_sharedkv.pinned_pool.child import child_env, run_child, worker_argv

        return run_child(worker_argv("probe-hazard"), child_env(conf), 300,
                         f"pytorch#192722 regression check with {conf}")


def _threshold_bytes(conf: str | None) -> int | None:
    for part in (conf or "").split(","):
        name, _, value = part.partition(":")
        if name.strip() == ROUND_KEY:
            return int(float(value)) << 20
    return None


def _judge(report: RouteReport, child: ChildResult) -> None:
    from pytest_sharedkv.pinned_pool.predict import gib

    data = child.data or {}
    checked, pinned = int(data["checked"]), int(data["pinned"])
    if pinned < checked:
        report.problems.append(
            f"{checked - pinned} of {checked} sampled addresses are pageable (first at byte "
            f"offset {data['first_pageable']}): the pool is not fully pinned")
    if child.fallback_warnings:
        report.problems.append("pageable fallback reported: " + child.fallback_warnings[0])
    for note in data.get("notes", []):
        report.problems.append(note)
    reserved = data.get("reserved")
    if isinstance(reserved, int):
        ratio = reserved / report.requested
        report.data["ratio"] = ratio
        if ratio > WASTE_LIMIT:
            report.problems.append(
                f"reserved {gib(reserved)} for {gib(report.requested)} asked ({ratio:.2f}x; the "
                f"limit is {WASTE_LIMIT}x): the host allocator rounded the request up")


def record(sink: ResultSink, report: RouteReport) -> None:
    from pytest_sharedkv.pinned_pool.predict import ROUTES, gib

    data = report.data
    sink.check(
        TIER, {"route": report.route, "size": gib(report.requested)},
        0 if report.problems else 1, 1, message="; ".join(report.problems), kind="pinned",
        detail={k: data.get(k) for k in ("requested", "reserved", "predicted", "ratio",
                                          "seconds", "gib_per_s", "checked", "pinned",
                                          "first_pageable", "torch", "alloc_conf", "phases",
                                          "threads", "fallback_warnings")}
        | {"description": ROUTES.get(report.route, ("", False))[0]},
    )


@pytest.fixture(scope="session")
def sharedkv_pinned_pool(pytestconfig: pytest.Config) -> PinnedPool:
    """Pools of --sharedkv-pool-gib through each allocation route, judged page by page."""
    from pytest_sharedkv.host.cuda_check import cuda_unavailable_reason
    from pytest_sharedkv.host.runtime_dir import RuntimeDirError, subdir
    from pytest_sharedkv.pinned_pool.budget import HostBudget, default_budget
    reason = cuda_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    settings = state_of(pytestconfig).settings
    budget = (int(settings.host_budget_gib * (1 << 30)) if settings.host_budget_gib
              else default_budget())
    if budget is None:
        pytest.skip("cannot tell how much host memory is free (no /proc/meminfo); "
                    "set --sharedkv-host-budget-gib")
    try:  # one ledger per machine: concurrent runs pin from the same host memory
        ledger = subdir(BUDGET_DIR)
    except RuntimeDirError as exc:
        pytest.fail(f"host budget: {exc}", pytrace=False)
    return PinnedPool(int(settings.pool_gib * (1 << 30)), HostBudget(ledger, budget),
                      settings.pool_timeout)


def pytest_sharedkv_tier_report() -> TierReport:
    """The pinned_pool tier's part of the terminal summary."""
    from pytest_sharedkv.pinned_pool import summary
    from pytest_sharedkv.report.terminal import TierReport

    return TierReport("pinned_pool", own_table=True, lines=summary.summary_lines)
