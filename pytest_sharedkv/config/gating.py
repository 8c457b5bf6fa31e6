"""Turning what a test needs (GPUs, free memory, lmcache, vllm) into a lease or a precise skip.

Runs in ``pytest_runtest_setup`` before any fixture, so the worker's
``CUDA_VISIBLE_DEVICES`` is set before a session fixture could touch CUDA. Devices are
checked and leased before any required package is imported, because importing lmcache or
vllm may initialise CUDA.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from pytest_sharedkv.config.markers import GpuNeed, gpu_need, required_distributions
from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.host.devices import Discovery, DiscoveryError, discover, free_gib
from pytest_sharedkv.host.leases import LEASE_DIR_NAME, Lease, LeaseManager, LeaseTimeout
from pytest_sharedkv.host.runtime_dir import RuntimeDirError, subdir

ITEM_LEASE = pytest.StashKey[Lease]()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def import_error(module: str) -> str | None:
    """None when MODULE imports, else '<module> not importable: <error>'."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # an ImportError, or whatever the package raised at import
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{module} not importable: {type(exc).__name__}: {first}"[:400]
    return None


class Gate:
    """One per process: the device list (found once, lazily) and the lease manager."""

    def __init__(self, settings: Settings, owner: str, lock_root: Path | None = None) -> None:
        self.settings = settings
        self.lock_root = lock_root  # None: the machine's shared directory, found on first use
        self.owner = owner
        self._discovery: Discovery | str | None = None
        self._leases: LeaseManager | None = None

    @property
    def discovery(self) -> Discovery | str:
        """The devices, or the reason the device list is unusable (a bad fake spec)."""
        if self._discovery is None:
            try:
                self._discovery = discover(self.settings.gpus,
                                           named_by=self.settings.source_of("gpus"))
            except DiscoveryError as exc:
                self._discovery = str(exc)
        return self._discovery

    def leases(self, discovery: Discovery) -> LeaseManager:
        if self._leases is None:
            if self.lock_root is None:
                try:
                    self.lock_root = subdir(LEASE_DIR_NAME)
                except RuntimeDirError as exc:
                    pytest.fail(f"GPU lease: {exc}", pytrace=False)
            self._leases = LeaseManager(self.lock_root, discovery.gpus, self.owner)
        return self._leases

    def setup(self, item: pytest.Item) -> None:
        need = gpu_need(item)
        if need is not None:
            item.stash[ITEM_LEASE] = self._lease(item, need)
        for module in required_distributions(item):
            reason = import_error(module)
            if reason is not None:
                pytest.skip(reason)

    def _lease(self, item: pytest.Item, need: GpuNeed) -> Lease:
        discovery = self.discovery
        if isinstance(discovery, str):
            pytest.fail(discovery, pytrace=False)
        if discovery.count < need.count:
            where = discovery.source + (f"; {discovery.note}" if discovery.note else "")
            pytest.skip(
                f"needs {_plural(need.count, 'CUDA device')}, {discovery.count} visible ({where})"
            )
        manager = self.leases(discovery)
        try:
            lease = manager.acquire(need.count, self.settings.lease_timeout, what=item.nodeid)
        except LeaseTimeout as exc:
            pytest.fail(f"GPU lease: {exc}", pytrace=False)
        if need.min_free_gib is not None:
            for gpu in lease.gpus:
                free = free_gib(gpu, discovery)
                if free is not None and free < need.min_free_gib:
                    manager.release(lease)
                    pytest.skip(
                        f"needs {need.min_free_gib:g} GiB free on each device; device "
                        f"{gpu.token} ({gpu.name}) has {free:.1f} GiB free"
                    )
        manager.bind(lease)
        return lease

    def teardown(self, item: pytest.Item) -> None:
        lease = item.stash.get(ITEM_LEASE, None)
        if lease is not None and self._leases is not None:
            self._leases.release(lease)
            del item.stash[ITEM_LEASE]


def worker_id() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")
