"""The packed_page tier's pytest side: layout registry, the (layout, path, device) matrix and
the runner that turns a round trip into a pass, a failure with the first wrong byte, an
xfail (a combination LMCache refuses by design) or a skip (hardware or kernels absent).

Registered by the main plugin, so loading it must cost a project without sharedkv tests
nothing: the layout registry is built on first need; torch and lmcache load when a case
runs. Fixtures are ``sharedkv_``-prefixed and the matrix parametrizes only tests of this
tier (``tiers.parametrizes``), never a user's ``packed_case``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_sharedkv.config.tiers import parametrizes
from pytest_sharedkv.state import state_of

if TYPE_CHECKING:
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.layouts.specs import LayoutRegistry
    from pytest_sharedkv.report.records import ResultSink
    from pytest_sharedkv.report.terminal import TierReport
TIER = "packed_page"
CASE_FIXTURE = "sharedkv_packed_case"
LAYOUTS: pytest.StashKey[LayoutRegistry] = pytest.StashKey()
# Paths per device: the server path is LMCache's CPU cache context; on CUDA the kernel runs
# as the torch fallback and (when lmcache.cuda_ops loaded) natively.
DEVICE_PATHS = {
    "cpu": ("kernel-fallback", "engine-driven", "server", "server-separate"),
    "cuda": ("kernel-fallback", "kernel-native", "engine-driven"),
}


@dataclass(frozen=True)
class PackedCase:
    layout: str
    path: str
    device: str

    @property
    def id(self) -> str:
        return f"{self.layout}-{self.path}-{self.device}"


def build_layouts(config: pytest.Config, settings: Settings) -> LayoutRegistry:
    from pytest_sharedkv.layouts.specs import default_registry

    registry = default_registry()
    config.hook.pytest_sharedkv_layouts(registry=registry)
    if settings.layouts is not None:
        unknown = [n for n in settings.layouts if n not in registry]
        if unknown:
            known = ", ".join(layout.name for layout in registry)
            raise pytest.UsageError(
                f"{settings.source_of('layouts')}: unknown layout(s) "
                f"{', '.join(unknown)}; known: {known}")
    return registry


def layouts_of(config: pytest.Config) -> LayoutRegistry:
    """The KV layouts, built (and the extension hook called) on first need."""
    if LAYOUTS not in config.stash:
        config.stash[LAYOUTS] = build_layouts(config, state_of(config).settings)
    return config.stash[LAYOUTS]


def pytest_configure(config: pytest.Config) -> None:
    # a --sharedkv-layouts naming an unknown layout is a usage error before any test runs
    if state_of(config).settings.layouts is not None:
        layouts_of(config)


def cases(registry: LayoutRegistry, settings: Settings) -> list[tuple[PackedCase, list[Any]]]:
    out = []
    for device, paths in DEVICE_PATHS.items():
        marks = [pytest.mark.sharedkv_gpu] if device == "cuda" else []
        for layout in registry:
            if settings.layouts is not None and layout.name not in settings.layouts:
                continue
            for path in paths:
                out.append((PackedCase(layout.name, path, device), marks))
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not parametrizes(metafunc, CASE_FIXTURE, TIER):
        return
    config = metafunc.config
    matrix = cases(layouts_of(config), state_of(config).settings)
    metafunc.parametrize(CASE_FIXTURE, [pytest.param(c, marks=m, id=c.id) for c, m in matrix],
                         indirect=True)


@pytest.fixture
def sharedkv_packed_case(request: pytest.FixtureRequest) -> PackedCase:
    """One (layout, LMCache path, device) cell of the packed_page matrix."""
    case: PackedCase | None = getattr(request, "param", None)
    if case is None:
        pytest.fail(f"{CASE_FIXTURE} is parametrized only for tests marked "
                    f"@pytest.mark.{TIER}", pytrace=False)
    return case


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str
    xfail: bool = False
    skip: bool = False


class PackedPageRunner:
    def __init__(self, registry: LayoutRegistry) -> None:
        self.registry = registry
        self._compiled: bool | None = None

    def compiled_bound(self) -> bool:
        """Whether LMCache bound its compiled kernels in this process (probed once)."""
        if self._compiled is None:
            from pytest_sharedkv.host.lmcache_status import compiled_bound

            self._compiled = compiled_bound()
        return self._compiled

    def run(self, case: PackedCase, sink: ResultSink) -> Verdict:
        import torch

        from pytest_sharedkv.host.cuda_check import cuda_unavailable_reason
        from pytest_sharedkv.host.lmcache_api import MissingLMCacheAPI
        from pytest_sharedkv.packed_page.round_trip import (
            MAY_PASS,
            Unsupported,
            expected_unsupported,
            round_trip,
        )

        if case.device == "cuda":
            reason = cuda_unavailable_reason()
            if reason is not None:
                return Verdict(False, reason, skip=True)
        spec = self.registry.get(case.layout)
        device = torch.device("cuda", 0) if case.device == "cuda" else torch.device("cpu")
        by_design = expected_unsupported(spec, case.path, case.device, self.compiled_bound())
        key = {"layout": case.layout, "device": case.device, "path": case.path}
        try:
            trip = round_trip(spec, case.path, device)
        except Unsupported as exc:
            if by_design is None:
                return Verdict(False, str(exc), skip=True)
            return self._xfail(sink, key, f"{by_design}; LMCache: {exc}")
        except MissingLMCacheAPI as exc:  # a release without this path: nothing was moved
            text = f"VOID: {case.id}: {exc}; this LMCache, as installed here, cannot run the path"
            sink.check(TIER, key, 0, 0, message=text, kind="bytes", status="void",
                       detail={"missing": exc.what, "tried": exc.tried})
            return Verdict(False, text)
        except Exception as exc:
            if by_design is None:
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return self._xfail(sink, key, f"{by_design}; LMCache: {type(exc).__name__}: {first}")
        for fact in trip.facts[:1]:
            if fact.startswith("vllm.v1.kv_cache_interface"):
                sink.fact("packed_page " + fact.split(":", 1)[0], fact.split(":", 1)[1].strip())
        check = trip.check
        sink.check(TIER, key, 1 if check.ok else 0, 1,
                   message="" if check.ok else check.describe(), kind="bytes",
                   detail={"moved_pages": check.moved_pages,
                           "untouched_pages": check.untouched_pages,
                           "bytes_compared": check.bytes_compared,
                           "mismatched_pages": check.mismatched_pages,
                           "mismatches": [m.describe() for m in check.mismatches],
                           "facts": trip.facts, "layout": spec.describe()})
        if by_design is not None and by_design not in MAY_PASS:
            sink.note(TIER, f"{case.id}: LMCache moved a combination it refused before "
                            f"({by_design}); bytes were checked", level="warning")
        text = f"{case.id} ({spec.describe()}): {check.describe()}"
        return Verdict(check.ok, text)

    @staticmethod
    def _xfail(sink: ResultSink, key: dict[str, str], reason: str) -> Verdict:
        sink.check(TIER, key, 0, 0, message=reason, kind="bytes",
                   status="xfail")
        return Verdict(False, reason, xfail=True)


@pytest.fixture(scope="session")
def sharedkv_packed_page(pytestconfig: pytest.Config) -> PackedPageRunner:
    """Runs packed_page cases: replicas, LMCache's transfer, the byte checker."""
    return PackedPageRunner(layouts_of(pytestconfig))


def pytest_sharedkv_tier_report() -> TierReport:
    """The packed_page tier's part of the terminal summary."""
    from pytest_sharedkv.report.terminal import TableSpec, TierReport

    return TierReport("packed_page", table=TableSpec(rows=("layout", "device"), column="path"))
