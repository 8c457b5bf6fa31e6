"""pinned_pool tier: the full host pool is really pinned, with the size that was asked.

Each route allocates a pool of ``--sharedkv-pool-gib`` in its own process: every sampled
page must be pinned (the CUDA runtime is asked about the first, the last and one address
per 64 MiB), no pageable fallback may be reported, and the host must not reserve more than
1% above the request. Then the power-of-two rounding of torch's host allocator, its cap
(``pinned_max_round_threshold_mb``) and the cap's known hazard are checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_sharedkv.pinned_pool.predict import LMCACHE_ROUTES, ROUTES, gib, next_power_of_two

if TYPE_CHECKING:  # torch stays out of collection
    from pytest_sharedkv.pinned_pool.fixtures import PinnedPool
    from pytest_sharedkv.report.records import ResultSink
ROUTE_PARAMS = [
    pytest.param(r, id=r, marks=[pytest.mark.sharedkv_requires("torch", "lmcache")]
                 if r in LMCACHE_ROUTES else [pytest.mark.sharedkv_requires("torch")])
    for r in ROUTES
]
ROUND_KEY = "pinned_max_round_threshold_mb"
HAZARD_CONF = "pinned_max_round_threshold_mb:128,pinned_max_cached_size_mb:1024"
REMEDY = ("remedy: size pools at exactly 2^k bytes, or pin through cudaHostRegister (LMCache "
          "--l1-use-lazy; this suite's sharedkv-register route), or use a torch with "
          f"{ROUND_KEY} and set it below the pool size")


@pytest.mark.pinned_pool
@pytest.mark.sharedkv_gpu
@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_pool_is_fully_pinned_at_the_size_asked(
    route: str, sharedkv_pinned_pool: PinnedPool, sharedkv_results: ResultSink
) -> None:
    from pytest_sharedkv.pinned_pool.fixtures import record

    report = sharedkv_pinned_pool.route(route)
    if report.skip:
        pytest.skip(report.skip)
    if report.data.get("requested"):
        record(sharedkv_results, report)
    if report.problems:
        pytest.fail(f"{route}: " + "; ".join(report.problems), pytrace=False)


@pytest.mark.pinned_pool
@pytest.mark.sharedkv_gpu
@pytest.mark.sharedkv_requires("torch")
def test_power_of_two_rounding_and_its_cap(
    sharedkv_pinned_pool: PinnedPool, sharedkv_results: ResultSink
) -> None:
    base = next_power_of_two(min(sharedkv_pinned_pool.nbytes, 1 << 30)) // 2 or 1 << 20
    asked = base + (1 << 20)
    plain = sharedkv_pinned_pool.route("torch-pin-memory", asked, alloc_conf="")
    if plain.skip:
        pytest.skip(plain.skip)
    reserved = plain.data.get("reserved")
    assert isinstance(reserved, int), f"torch reported no host allocator statistics: {plain}"
    conf = f"{ROUND_KEY}:{base >> 20}"
    probe = sharedkv_pinned_pool.conf_accepted(conf)
    accepted = bool(probe.data and probe.data.get("accepted"))
    torch_version = plain.data.get("torch")
    sharedkv_results.note("pinned_pool", f"torch {torch_version}: {gib(asked)} asked pinned "
                          f"{gib(reserved)} ({reserved / asked:.2f}x) with default settings")
    if not accepted:
        error = (probe.data or {}).get("error") or probe.error
        sharedkv_results.note(
            "pinned_pool", f"torch {torch_version} rejects {ROUND_KEY} ({error}): every pool "
            f"is rounded up to a power of two (17 GiB + 1 MiB pins 32 GiB). {REMEDY}",
            level="warning")
        assert reserved == next_power_of_two(asked), (
            f"{gib(asked)} asked: expected the power-of-two reservation "
            f"{gib(next_power_of_two(asked))}, torch reserved {gib(reserved)}")
        return
    capped = sharedkv_pinned_pool.route("torch-pin-memory", asked, alloc_conf=conf)
    ratio = capped.data.get("ratio")
    shown = f"{ratio:.3f}x" if isinstance(ratio, float) else "unknown"
    sharedkv_results.note("pinned_pool", f"with {conf}: {gib(asked)} asked pinned "
                          f"{gib(capped.data.get('reserved') or 0)} ({shown})")
    assert not capped.problems, f"with {conf}: " + "; ".join(capped.problems)


@pytest.mark.pinned_pool
@pytest.mark.sharedkv_gpu
@pytest.mark.sharedkv_requires("torch")
def test_round_threshold_below_the_cache_limit_is_safe(
    sharedkv_pinned_pool: PinnedPool, sharedkv_results: ResultSink
) -> None:
    """pytorch#192722: rounding off below the cache limit let a 200 MiB request reuse a
    cached 150 MiB block (a 50 MiB heap overflow). Run in a child process: it may crash."""
    probe = sharedkv_pinned_pool.conf_accepted(HAZARD_CONF)
    if probe.data is None:
        pytest.fail(f"probing {HAZARD_CONF}: {probe.error}", pytrace=False)
    if not probe.data["accepted"]:
        # this torch refuses the configuration outright, so it cannot be run into the hazard
        error = str(probe.data["error"])
        assert "pinned_max" in error or "Unrecognized" in error, error
        sharedkv_results.note("pinned_pool", f"hazard check: torch refuses {HAZARD_CONF} "
                              f"({error}); the configuration cannot be used")
        return
    result = sharedkv_pinned_pool.hazard(HAZARD_CONF)
    if result.data is None:
        pytest.fail(f"{result.error}: a crash here is the heap overflow of pytorch#192722; "
                    f"stderr: {' | '.join(result.stderr_tail)}", pytrace=False)
    assert not result.data["reused_smaller_block"], (
        f"with {HAZARD_CONF} a 200 MiB pinned request was handed a cached 150 MiB block "
        "(pytorch#192722): writing it overflows the heap; upgrade torch, or keep "
        f"{ROUND_KEY} >= pinned_max_cached_size_mb")
    sharedkv_results.note("pinned_pool", f"hazard check: {HAZARD_CONF} is safe on this torch")
