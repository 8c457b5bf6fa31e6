"""The injected sitecustomize (first on a launched process's PYTHONPATH) still loads the
environment's own, once: a coverage subprocess hook or a distribution's keeps working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_sharedkv.stack.launch.spec import INJECT_DIR


def test_the_next_sitecustomize_on_the_path_still_runs_once(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    marker = tmp_path / "marker"
    (other / "sitecustomize.py").write_text(
        f"with open({str(marker)!r}, 'a') as f:\n    f.write('loaded\\n')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(INJECT_DIR), str(other)])}
    for name in ("SHAREDKV_INJECT_DELAY_CYCLES", "SHAREDKV_CORRUPT_CONTROL",
                 "SHAREDKV_KV_AUDIT_DIR"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", "import sitecustomize; print(sitecustomize.__file__)"],
        env=env, capture_output=True, text=True, timeout=60, check=True)
    assert Path(done.stdout.strip()).parent == INJECT_DIR  # ours is the one imported
    assert marker.read_text() == "loaded\n"  # and the next one ran, once


def test_the_hooks_load_where_only_the_checkout_holds_the_plugin(tmp_path: Path) -> None:
    """``python -m pytest_sharedkv`` from a checkout's root finds the plugin through the
    working directory; the launched engines (``python -c``) did not, so no hook loaded
    (seen on an H200: the gate, the audit and the sync control all silently absent). An
    interpreter without the plugin installed must still load them, the checkout last on
    its path."""
    base = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run([base, "-c", "import pytest_sharedkv"], capture_output=True,
                           cwd=tmp_path)
    if probe.returncode == 0:
        pytest.skip(f"{base} has pytest_sharedkv installed: nothing to find")
    inject = INJECT_DIR
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(inject),
           "SHAREDKV_KV_AUDIT_DIR": str(tmp_path / "audit"), "SHAREDKV_KV_AUDIT_ROLE": "A"}
    out = subprocess.run(
        [base, "-c", "import sys; print('pytest_sharedkv.engine_hooks.kv_audit_hook' in "
         "sys.modules, sys.path[-1])"], capture_output=True, text=True, cwd=tmp_path,
        env=env, timeout=60)
    assert "Error in sitecustomize" not in out.stderr, out.stderr
    assert out.stdout.split() == ["True", str(inject.parent.parent.parent)]
