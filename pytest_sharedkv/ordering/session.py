"""One ordering session per process: the backend, the prober, the copy paths and the verdicts.

The negative control's delayed result for each (direction, size) is measured once and
cached: it is the sensitivity gate every other cell of that direction and size is judged
against. A cell whose negative control did not see stale bytes in every delayed trial is
void, whatever the target did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_sharedkv.config.options import Settings, format_size
from pytest_sharedkv.host.cuda_check import LAUNCH_BLOCKING_ENV, launch_blocking
from pytest_sharedkv.host.lmcache_api import MissingLMCacheAPI
from pytest_sharedkv.ordering.cells import Cell, format_cycles
from pytest_sharedkv.ordering.probe import CellResult, CopyImpl, Prober, StreamBackend
from pytest_sharedkv.ordering.targets import (
    REFERENCE_REASON,
    CopyTarget,
    TargetRegistry,
    remedy_lines,
)
from pytest_sharedkv.report.records import ResultSink

if TYPE_CHECKING:
    from pytest_sharedkv.host.lmcache_status import LMCacheStatus

TIER = "ordering"


def blind_remedy(blocking: bool) -> str:
    """What to do about a blind probe: the variable that blinds it, or the delay."""
    if blocking:
        return (f"{LAUNCH_BLOCKING_ENV} is set where the probe ran: every launch is "
                "synchronous, so the delay ends before the copy starts. Unset "
                f"{LAUNCH_BLOCKING_ENV} for the ordering tier.")
    return ("Raise --sharedkv-delay-cycles, and check that the probe stream is "
            "non-blocking.")


@dataclass(frozen=True)
class Judgement:
    ok: bool
    message: str
    expected: str = ""  # a reference's fault: the xfail reason (the run does not fail on it)


@dataclass(frozen=True)
class KernelPath:
    """Which kernels a package's copies run in this process (host.lmcache_status)."""

    path: str  # compiled | torch-fallback | unknown | not-installed
    module: str  # the compiled extension, e.g. lmcache.cuda_ops

    @property
    def compiled(self) -> bool:
        return self.path == "compiled"


def lmcache_kernel_path() -> LMCacheStatus:
    """LMCache's status here, looked up at call time (a self-test stands one in)."""
    from pytest_sharedkv.host import lmcache_status

    return lmcache_status.probe()


class OrderingSession:
    def __init__(self, backend: StreamBackend, registry: TargetRegistry,
                 settings: Settings,
                 status: Callable[[], LMCacheStatus] = lmcache_kernel_path) -> None:
        self.backend = backend
        self._status = status
        self._kernel_paths: dict[str, KernelPath] = {}
        self.registry = registry
        self.settings = settings
        self.prober = Prober(backend)
        self.negative = registry.negative_control(backend.name)
        self._impls: dict[str, CopyImpl] = {}
        self._gate: dict[tuple[str, int], CellResult] = {}
        self.pending_facts: list[tuple[str, str]] = [("ordering backend", backend.describe())]

    def impl(self, target: CopyTarget) -> CopyImpl:
        if target.name not in self._impls:
            self._impls[target.name] = target.load_factory()(self.backend, self.settings.sizes)
        return self._impls[target.name]

    def kernel_path(self, target: CopyTarget) -> KernelPath | None:
        """The kernel path of the package TARGET is a fallback of (or whose compiled build
        would remedy it), probed once; None for a target that names none."""
        package = target.fallback_for or target.compiled_for
        if not package:
            return None
        if package not in self._kernel_paths:
            if package == "lmcache":
                status = self._status()
                found = KernelPath(status.kernel_path, status.kernel_module or "lmcache.cuda_ops")
            else:
                found = KernelPath("unknown", f"{package}'s compiled kernels")
            self._kernel_paths[package] = found
        return self._kernel_paths[package]

    def is_reference(self, target: CopyTarget) -> bool:
        """A fallback whose package binds its compiled kernels here: not the path under test."""
        path = self.kernel_path(target) if target.fallback_for else None
        return path is not None and path.compiled

    def gate(self, direction: str, nbytes: int, sink: ResultSink) -> CellResult:
        """The negative control under delay for this direction and size (measured once)."""
        key = (direction, nbytes)
        if key not in self._gate:
            self._gate[key] = self.prober.run_cell(
                self.negative.name, self.impl(self.negative), direction, nbytes,
                self.settings.delay_cycles, self.settings.trials)
            result = self._gate[key]
            self._record(sink, self.negative, result, sensitive=result.passed == 0)
        return self._gate[key]

    def _record(self, sink: ResultSink, target: CopyTarget, result: CellResult,
                sensitive: bool) -> None:
        sink.check(
            TIER,
            {"target": target.name, "direction": result.direction, "size": result.size,
             "delay": format_cycles(result.delay_cycles)},
            result.passed, result.trials, role=target.role, message=result.first_failure(),
            kind="ordering", status="" if sensitive else "void",
            detail={**result.detail(), "backend": self.backend.name,
                    "simulated": self.backend.simulated, "sensitive": sensitive,
                    "launch_blocking": launch_blocking(),
                    "description": self.impl(target).description or target.summary,
                    "remedy": target.remedy, **self._path_detail(target)},
        )

    def _path_detail(self, target: CopyTarget) -> dict[str, object]:
        path = self.kernel_path(target)
        if path is None:
            return {}
        return {"fallback_for": target.fallback_for, "compiled_for": target.compiled_for,
                "kernel_path": path.path, "kernel_module": path.module,
                "reference": self.is_reference(target)}

    def judge(self, cell: Cell, sink: ResultSink) -> Judgement:
        target = self.registry.get(cell.target)
        for name, value in self.pending_facts:
            sink.fact(name, value)
        self.pending_facts.clear()
        try:
            impl = self.impl(target)
        except MissingLMCacheAPI as exc:  # a release without this path proves nothing here
            return self._missing(target, cell, exc, sink)
        trials, cycles = self.settings.trials, self.settings.delay_cycles
        gate = self.gate(cell.direction, cell.nbytes, sink)
        sensitive = gate.passed == 0
        if target is self.negative:
            delayed = gate  # recorded when the gate ran
        else:
            delayed = self.prober.run_cell(target.name, impl, cell.direction, cell.nbytes,
                                           cycles, trials)
            self._record(sink, target, delayed, sensitive)
        undelayed = self.prober.run_cell(target.name, impl, cell.direction, cell.nbytes, 0,
                                         trials)
        self._record(sink, target, undelayed, sensitive)
        return self._verdict(target, cell, delayed, undelayed, gate)

    def _missing(self, target: CopyTarget, cell: Cell, exc: MissingLMCacheAPI,
                 sink: ResultSink) -> Judgement:
        text = (f"VOID: {target.name} cannot be probed: {exc}; this LMCache, as installed here, "
                "cannot run the copy path it names")
        cycles = self.settings.delay_cycles
        sink.check(TIER, {"target": target.name, "direction": cell.direction,
                          "size": format_size(cell.nbytes), "delay": format_cycles(cycles)},
                   0, 0, role=target.role, message=text, kind="ordering", status="void",
                   detail={"missing": exc.what, "tried": exc.tried, "delay_cycles": cycles,
                           "backend": self.backend.name, "description": target.summary})
        return Judgement(False, text)

    def _verdict(self, target: CopyTarget, cell: Cell, delayed: CellResult,
                 undelayed: CellResult, gate: CellResult) -> Judgement:
        where = (f"{cell.direction} {format_size(cell.nbytes)}, delay "
                 f"{format_cycles(delayed.delay_cycles)} cycles")
        n = delayed.trials
        if gate.passed:
            blind = (f"probe NOT sensitive for {where}: the negative control "
                     f"{self.negative.name} passed {gate.passed}/{n} delayed checks (it must "
                     f"see stale bytes in every one); results for this cell are VOID. "
                     f"{blind_remedy(launch_blocking())}")
            return Judgement(False, blind if target is self.negative else f"VOID: {blind}")
        if target.role == "negative-control":
            return Judgement(True, f"probe is sensitive for {where}: {self.negative.name} saw "
                                   f"stale bytes in {n}/{n} delayed checks "
                                   f"({undelayed.passed}/{n} undelayed checks passed)")
        if delayed.passed == n and undelayed.passed == n:
            return Judgement(True, f"{target.name}: stream-ordered for {where}")
        parts = []
        if delayed.passed < n:
            parts.append(f"{delayed.failed_trials}/{n} delayed checks saw stale bytes "
                         f"(first: {delayed.first_failure()})")
        if undelayed.passed < n:
            parts.append(f"{undelayed.failed_trials}/{n} undelayed checks saw stale bytes "
                         f"(first: {undelayed.first_failure()})")
        what = "NOT stream-ordered" if target.role == "under-test" else (
            "CONTROL FAILED (the probe or the platform is broken)")
        text = f"{target.name} ({self.impl(target).description or target.summary}): {what} " \
               f"for {where}: " + "; ".join(parts)
        path = self.kernel_path(target)
        reference = self.is_reference(target)
        remedies = remedy_lines(target.remedy, target.compiled_for, reference,
                                path.path if path else "", path.module if path else "", None)
        if remedies:
            text += ". " + "; ".join(remedies)
        return Judgement(False, text, REFERENCE_REASON if reference else "")

    def close(self) -> None:
        errors = []
        for impl in self._impls.values():
            try:
                impl.close()
            except Exception as exc:  # teardown must reach every allocator
                errors.append(f"{impl.description}: {exc}")
        self._impls.clear()
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()
        if errors:
            raise RuntimeError("ordering teardown: " + "; ".join(errors))
