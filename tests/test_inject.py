"""The injected sitecustomize (first on a launched process's PYTHONPATH) still loads the
environment's own, once: a coverage subprocess hook or a distribution's keeps working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pytest_sharedkv.stack.providers import INJECT_DIR


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
