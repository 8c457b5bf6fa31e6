"""Self-test helpers: every test drives a separate pytest run through pytester.

Runs that could touch CUDA (or must prove torch was never imported) use
``runpytest_subprocess``; pure plumbing runs in-process for speed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_sharedkv.devices import FAKE_GPUS_ENV


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs must not inherit this run's xdist identity or device binding."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                 "CUDA_VISIBLE_DEVICES", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Set the fake device list the plugin discovers (also inherited by subprocess runs)."""

    def _set(spec: str) -> None:
        monkeypatch.setenv(FAKE_GPUS_ENV, spec)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    _set("")
    return _set
