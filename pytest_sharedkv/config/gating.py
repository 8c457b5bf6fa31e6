"""Turning what a test needs (GPUs, free memory, lmcache, vllm) into a lease or a precise skip.

Runs in ``pytest_runtest_setup`` before any fixture, so the test's ``CUDA_VISIBLE_DEVICES``
is set before a fixture could touch CUDA (and restored at its teardown). Devices are
checked and leased before any required package is imported, because importing lmcache or
vllm may initialise CUDA. What a test starts and outlives it (the session's replica pair)
takes a lease of the test's devices of its own (``Gate.hold``), released with it.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from pytest_sharedkv.config.markers import GpuNeed, gpu_need, required_distributions
from pytest_sharedkv.config.options import Settings
from pytest_sharedkv.host.devices import Discovery, DiscoveryError, discover, free_gib
from pytest_sharedkv.host.leases import (
    LEASE_DIR_NAME,
    Binding,
    Lease,
    LeaseManager,
    LeaseTimeout,
)
from pytest_sharedkv.host.runtime_dir import RuntimeDirError, subdir

ITEM_LEASE = pytest.StashKey[Lease]()
ITEM_BINDING = pytest.StashKey[Binding]()


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
        self.current: Lease | None = None  # the running test's

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
            lease = self._lease(item, need)
            assert self._leases is not None
            item.stash[ITEM_LEASE] = self.current = lease
            item.stash[ITEM_BINDING] = self._leases.bind(lease)
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
        return lease

    def teardown(self, item: pytest.Item) -> None:
        lease = item.stash.get(ITEM_LEASE, None)
        if lease is not None and self._leases is not None:
            binding = item.stash.get(ITEM_BINDING, None)
            if binding is not None:
                self._leases.unbind(binding)
                del item.stash[ITEM_BINDING]
            self._leases.release(lease)
            del item.stash[ITEM_LEASE]
        self.current = None

    def hold(self, what: str) -> Lease | None:
        """A lease of the running test's devices for WHAT, which the test starts and which
        outlives it (the replica pair's engines); None where the test leased none."""
        if self.current is None or self._leases is None:
            return None
        return self._leases.share(self.current, what)

    def release(self, lease: Lease) -> None:
        if self._leases is not None:
            self._leases.release(lease)


def worker_id() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")
