"""In a project without sharedkv tests the plugin is silent: it runs no subprocess (no
nvidia-smi, no lmcache probe), writes nothing (pytest's cache, temp dirs), prints nothing
and adds no warning filter. Its time cost is measured by ``benchmarks/startup.py`` (a
timed test would be flaky on a shared 2-core CI machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FAKE_SMI = """#!/bin/sh
echo "$@" >> "{calls}"
echo "0, NVIDIA H200, 143771, 140000, GPU-00000000-1111-2222-3333-444444444444"
"""
# Records every process the pytest run starts, and what pytest ended up filtering.
CONFTEST = """
import subprocess

_popen_init = subprocess.Popen.__init__


def _recording_init(self, args, *a, **k):
    with open({spawned!r}, "a") as fh:
        fh.write(repr(args) + "\\n")
    _popen_init(self, args, *a, **k)


subprocess.Popen.__init__ = _recording_init


def pytest_sessionfinish(session):
    with open({filters!r}, "w") as fh:
        fh.write(repr(session.config.getini("filterwarnings")))
"""


def _run(project: Path, temproot: Path, bindir: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "SHAREDKV_")) and k != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTEST_DEBUG_TEMPROOT"] = str(temproot)
    out = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=project, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _temp_dirs(temproot: Path) -> set[str]:
    """What a run left under pytest's temp root (emptied), numbered dirs unnumbered."""
    import re
    import shutil

    found = {re.sub(r"pytest-\d+", "pytest-N", str(p.relative_to(temproot)))
             for p in temproot.rglob("*")}
    shutil.rmtree(temproot)
    temproot.mkdir()
    return found


def _cache(project: Path) -> set[str]:
    root = project / ".pytest_cache"
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize("workers", [None, "2"])
def test_silent_in_a_project_without_sharedkv_tests(tmp_path: Path, workers: str | None
                                                     ) -> None:
    bindir, calls, spawned = tmp_path / "bin", tmp_path / "smi-calls", tmp_path / "spawned"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(FAKE_SMI.format(calls=calls))
    (bindir / "nvidia-smi").chmod(0o755)
    project, temproot = tmp_path / "project", tmp_path / "temproot"
    project.mkdir()
    temproot.mkdir()
    (project / "conftest.py").write_text(CONFTEST.format(spawned=str(spawned),
                                                         filters=str(tmp_path / "filters")))
    (project / "test_plain.py").write_text("def test_one():\n    pass\n")
    xdist = ["-n", workers] if workers else []
    _run(project, temproot, bindir, "-p", "no:sharedkv", *xdist)  # pytest's own cache files
    before = _cache(project)
    temp_before = _temp_dirs(temproot)  # what pytest (and xdist, for its workers) create
    without_filters = (tmp_path / "filters").read_text()
    spawned.unlink(missing_ok=True)

    stdout = _run(project, temproot, bindir, *xdist)

    assert not calls.exists(), calls.read_text()
    spawned_args = spawned.read_text() if spawned.exists() else ""
    assert "nvidia-smi" not in spawned_args and "lmcache_status" not in spawned_args
    if not workers:  # (xdist starts its workers through execnet's own Popen)
        assert spawned_args == ""
    assert _cache(project) == before
    assert _temp_dirs(temproot) == temp_before, "the plugin created temp dirs"
    assert [line for line in stdout.splitlines() if "sharedkv" in line
            and not line.startswith("plugins:")] == []
    assert (tmp_path / "filters").read_text() == without_filters

    # the control: one sharedkv test, and the same probes see the plugin at work
    (project / "test_tiered.py").write_text(
        "import pytest\n\n@pytest.mark.packed_page\ndef test_tiered():\n    pass\n")
    stdout = _run(project, temproot, bindir, *xdist)
    assert calls.exists()
    assert "sharedkv: GPUs: 1 CUDA device(s) via nvidia-smi: 0: NVIDIA H200" in stdout
