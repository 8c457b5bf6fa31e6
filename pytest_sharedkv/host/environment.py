"""The environment header: versions, GPUs and LMCache's kernel path, without importing torch.

Versions come from package metadata and ``torch/version.py`` read as text; GPUs from
nvidia-smi. Whether ``lmcache.cuda_ops`` loads can only be learned by importing it, so
that runs in a subprocess, only where a CUDA device is visible, and its answer is cached
(per interpreter, package versions and device list) in pytest's cache.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_sharedkv.host.devices import Discovery
from pytest_sharedkv.host.lmcache_status import LMCacheStatus

PROBE_TIMEOUT_S = 180.0
CACHE_KEY = "sharedkv/lmcache-status"
# Where the pair's KV lives between its replicas (the topology and its L2), said by the
# tier that launches the pair (the stack's configure), since this layer reads no settings.
TOPOLOGY_LINE: pytest.StashKey[str] = pytest.StashKey()


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_build() -> tuple[str | None, str | None]:
    """(torch version, CUDA version it was built for), read from torch/version.py as text."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = path.read_text()
    except OSError:
        return dist_version("torch"), None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
    return (version.group(1) if version else dist_version("torch"), cuda.group(1) if cuda else None)


@dataclass(frozen=True)
class Versions:
    torch: str | None
    torch_cuda: str | None
    lmcache: str | None
    vllm: str | None
    xdist: str | None

    @classmethod
    def read(cls) -> Versions:
        torch, cuda = torch_build()
        return cls(torch, cuda, dist_version("lmcache"), dist_version("vllm"),
                   dist_version("pytest-xdist"))

    def line(self) -> str:
        def show(name: str, value: str | None) -> str:
            return f"{name} {value}" if value else f"{name} not installed"

        torch = show("torch", self.torch)
        if self.torch:
            torch += f" (CUDA {self.torch_cuda})" if self.torch_cuda else " (CPU build)"
        return "; ".join(
            [torch, show("lmcache", self.lmcache), show("vllm", self.vllm),
             show("xdist", self.xdist)]
        )


def _cache_token(versions: Versions, discovery: Discovery) -> str:
    cuda_ops = ""
    spec = importlib.util.find_spec("lmcache")
    if spec is not None and spec.submodule_search_locations:
        for so in Path(next(iter(spec.submodule_search_locations))).glob("cuda_ops*.so"):
            cuda_ops = f"{so.name}:{so.stat().st_mtime_ns}"
    return "|".join(
        [sys.executable, str(versions.torch), str(versions.lmcache), cuda_ops,
         ",".join(g.uuid or g.token for g in discovery.gpus)]
    )


def probe_lmcache(config: pytest.Config, versions: Versions, discovery: Discovery
                  ) -> LMCacheStatus | str:
    """LMCache's kernel path from a subprocess (cached), or a line saying why not checked."""
    if versions.lmcache is None:
        return "lmcache not installed (pip install 'pytest-sharedkv[lmcache]')"
    if discovery.fake or not discovery.gpus:
        return "lmcache.cuda_ops: not checked (no CUDA device visible)"
    cache = getattr(config, "cache", None)
    token = _cache_token(versions, discovery)
    if cache is not None:
        cached = cache.get(CACHE_KEY, None)
        if isinstance(cached, dict) and cached.get("token") == token:
            return LMCacheStatus.from_json(cached["status"])
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = discovery.gpus[0].token
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest_sharedkv.host.lmcache_status"], capture_output=True,
            text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"lmcache.cuda_ops: probe did not finish ({type(exc).__name__})"
    for line in out.stdout.splitlines():
        if line.startswith("SHAREDKV-STATUS "):
            status = LMCacheStatus.from_json(line.split(" ", 1)[1])
            if cache is not None:
                cache.set(CACHE_KEY, {"token": token, "status": status.to_json()})
            return status
    tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"lmcache.cuda_ops: probe failed (exit {out.returncode}: {tail[0][:200]})"


def header(config: pytest.Config, discovery: Discovery | str
           ) -> tuple[list[str], LMCacheStatus | str]:
    """The header lines, and LMCache's status behind them (or the line saying why it was
    not checked): the JSON report and the reference key read the status, not the text."""
    versions = Versions.read()
    lines = [f"sharedkv: {versions.line()}"]
    if isinstance(discovery, str):
        lines.append(f"sharedkv: GPUs: {discovery}")
        return (lines + _topology(config),
                "lmcache.cuda_ops: not checked (no usable device discovery)")
    lines.append(f"sharedkv: GPUs: {discovery.describe()}")
    status = probe_lmcache(config, versions, discovery)
    lines.append(f"sharedkv: {status if isinstance(status, str) else status.describe()}")
    return lines + _topology(config), status


def _topology(config: pytest.Config) -> list[str]:
    line = config.stash.get(TOPOLOGY_LINE, None)
    return [f"sharedkv: {line}"] if line else []


def header_lines(config: pytest.Config, discovery: Discovery | str) -> list[str]:
    return header(config, discovery)[0]


def lmcache_data(status: LMCacheStatus | str) -> dict[str, object]:
    """LMCache as the JSON report keeps it: version, kernel path (compiled, torch-fallback,
    unknown, not-installed, not-checked), the compiled extension, and why."""
    if isinstance(status, str):
        return {"version": dist_version("lmcache"), "kernel_path": "not-checked",
                "kernel_module": None, "key": None, "why": status}
    return status.data()


def lmcache_key(status: LMCacheStatus | str) -> str:
    """lmcache-<version>-<kernel path>, or lmcache-<version>-not-checked."""
    if isinstance(status, str):
        return f"lmcache-{dist_version('lmcache') or 'none'}-not-checked"
    return status.key()
