"""host.lmcache_api: the tiers find what moved between LMCache releases by looking, and a
release that has none of the known places is VOID naming them (LMCache 0.5.3 on the GPU
host: 69 ordering and packed_page tests died on ImportErrors of 0.5.6's module names)."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest

from pytest_sharedkv.host import lmcache_api


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    module = ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_the_first_place_a_release_has_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    places = ("sharedkv_fake_new:kernels.copy", "sharedkv_fake_old:copy")
    _module(monkeypatch, "sharedkv_fake_old", copy="old")
    assert lmcache_api.resolve("copy", places) == "old"  # 0.5.3: only the old place
    assert lmcache_api.where("copy", places) == "sharedkv_fake_old:copy"
    _module(monkeypatch, "sharedkv_fake_new", kernels=ModuleType("kernels"))
    assert lmcache_api.resolve("copy", places) == "old"  # the new module, without the name
    sys.modules["sharedkv_fake_new"].kernels.copy = "new"
    assert lmcache_api.resolve("copy", places) == "new"  # 0.5.6: the newest place first


def test_a_release_with_none_of_the_places_names_every_one_it_tried() -> None:
    with pytest.raises(lmcache_api.MissingLMCacheAPI) as caught:
        lmcache_api.resolve("copy", ("sharedkv_absent_a:x", "sharedkv_absent_b:y.z"))
    assert caught.value.what == "copy"
    assert caught.value.tried == [
        "sharedkv_absent_a:x (ModuleNotFoundError: No module named 'sharedkv_absent_a')",
        "sharedkv_absent_b:y.z (ModuleNotFoundError: No module named 'sharedkv_absent_b')"]
    assert ("has no copy (looked in: sharedkv_absent_a:x (ModuleNotFoundError: No module "
            "named 'sharedkv_absent_a'); ") in str(caught.value)
    assert isinstance(caught.value, LookupError)  # not an ImportError a tier would re-raise


def test_only_the_keywords_a_function_takes_are_passed() -> None:
    def v053(ctx: object, direction: object) -> None: ...

    def v056(ctx: object, direction: object, *, transfer_key: str) -> None: ...

    assert lmcache_api.known_keywords(v053, transfer_key="store") == {}
    assert lmcache_api.known_keywords(v056, transfer_key="store") == {"transfer_key": "store"}
    assert not lmcache_api.accepts(len, "anything")  # a builtin: no readable signature


def test_the_installed_lmcache_has_a_place_for_every_name() -> None:
    """Drift guard: each release the suite supports (CI installs the newest) holds every
    name somewhere the table lists; a release that moved one fails here first."""
    pytest.importorskip("lmcache")
    found = {what: lmcache_api.where(what) for what in lmcache_api.PLACES}
    assert set(found) == set(lmcache_api.PLACES)
    assert int(lmcache_api.direction("H2D")) != int(lmcache_api.direction("D2H"))


class _Sink:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def note(self, tier: str, text: str, **kwargs: Any) -> None:
        self.notes.append(text)

    def fact(self, name: str, value: str) -> None:
        return None

    def check(self, tier: str, key: dict[str, str], passed: int, trials: int,
              **kwargs: Any) -> None:
        self.checks.append({"tier": tier, "key": key, "passed": passed, "trials": trials,
                            **kwargs})


def test_a_packed_page_path_the_release_lacks_is_a_void_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from pytest_sharedkv.layouts.specs import default_registry
    from pytest_sharedkv.packed_page import round_trip
    from pytest_sharedkv.packed_page.fixtures import PackedCase, PackedPageRunner

    def lacking(*args: Any) -> None:
        raise lmcache_api.MissingLMCacheAPI("CPUCacheContext", ["a:b (ModuleNotFoundError)"])

    monkeypatch.setattr(round_trip, "round_trip", lacking)
    sink = _Sink()
    verdict = PackedPageRunner(default_registry()).run(
        PackedCase("fa-nhd-bf16", "server", "cpu"), sink)  # type: ignore[arg-type]
    assert not verdict.ok and not verdict.xfail and not verdict.skip
    assert verdict.message.startswith("VOID: fa-nhd-bf16-server-cpu: LMCache ")
    assert "has no CPUCacheContext (looked in: a:b (ModuleNotFoundError))" in verdict.message
    assert [(c["status"], c["trials"], c["detail"]["missing"]) for c in sink.checks] == [
        ("void", 0, "CPUCacheContext")]


@pytest.mark.parametrize("compiled", [True, False])
def test_cpu_kv_through_bound_compiled_kernels_is_an_xfail_only_when_they_are_bound(
        monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    """LMCache 0.5.3 and 0.5.6 with their kernels bound send CPU-resident KV through them
    (CUDAGuardImpl on a cpu tensor); the cell is an xfail naming why, decided by what the
    probe bound, not by the error's text; without the kernels the same error is a failure."""
    pytest.importorskip("torch")
    from pytest_sharedkv.layouts.specs import default_registry
    from pytest_sharedkv.packed_page import round_trip
    from pytest_sharedkv.packed_page.fixtures import PackedCase, PackedPageRunner

    def cuda_only(*args: Any) -> None:
        raise RuntimeError("CUDAGuardImpl initialized with non-CUDA DeviceType: cpu")

    monkeypatch.setattr(round_trip, "round_trip", cuda_only)
    runner = PackedPageRunner(default_registry())
    runner._compiled = compiled
    sink = _Sink()
    case = PackedCase("fa-nhd-bf16", "server", "cpu")
    if not compiled:
        with pytest.raises(RuntimeError, match="CUDAGuardImpl"):
            runner.run(case, sink)  # type: ignore[arg-type]
        return
    verdict = runner.run(case, sink)  # type: ignore[arg-type]
    assert verdict.xfail and not verdict.ok
    assert verdict.message.startswith(round_trip.COMPILED_TAKES_CUDA_ONLY + "; LMCache: "
                                      "RuntimeError: CUDAGuardImpl")
    assert [c["status"] for c in sink.checks] == ["xfail"]
    # a release whose path there does not reach the kernels passes, with no "refused
    # before" warning (0.5.6's engine-driven CPU path on the H200)
    from pytest_sharedkv.packed_page.check import CheckResult

    clean = round_trip.Trip(CheckResult(moved_pages=6, untouched_pages=10, bytes_compared=96))
    monkeypatch.setattr(round_trip, "round_trip", lambda *args: clean)
    passed = runner.run(PackedCase("fa-nhd-bf16", "engine-driven", "cpu"),
                        sink)  # type: ignore[arg-type]
    assert passed.ok and sink.notes == []
    # the torch fallback's own cell stays a real check on the same host
    assert round_trip.expected_unsupported(
        default_registry().get("fa-nhd-bf16"), "kernel-fallback", "cpu", True) is None


def test_compiled_kernels_count_as_bound_only_where_they_shadow_the_fallback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """LMCache's bind_native sets instance attributes over the class's torch fallback: the
    shared check the probe, the ordering tier and packed_page read says bound only then,
    after ensure_native ran; no DeviceOps or an LMCache that fails is not bound."""
    import types

    from pytest_sharedkv.host import lmcache_status

    class Ops:
        def lmcache_memcpy_async(self) -> None:  # the class's torch fallback
            return None

        def ensure_native(self) -> None:
            if self.loads:
                self.lmcache_memcpy_async = lambda: None  # type: ignore[method-assign]

        loads = False

    ops = Ops()
    fake = types.ModuleType("lmcache")
    fake.device_ops = ops  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lmcache", fake)
    assert not lmcache_status.compiled_bound()
    ops.loads = True
    assert lmcache_status.compiled_bound()
    assert not lmcache_status.kernels_bound(None)
    monkeypatch.setitem(sys.modules, "lmcache", None)  # import fails
    assert not lmcache_status.compiled_bound()
