#!/usr/bin/env bash
# pytest-sharedkv lane for LMCache's Buildkite CI: does LMCache move KV bytes correctly?
#   gpu: the ordering tier (every KV copy path honours the current CUDA stream), then
#        packed_page, pinned_pool and the transfer provider (the real LMCache server
#        between two processes, per allocator, with a delay), all with
#        --sharedkv-require-gpu (a lane that cannot test must not go green) and all with
#        CUDA_LAUNCH_BLOCKING unset (with it no stream-ordering fault could show).
#   cpu: packed_page and the transfer provider on CPU (LMCache's torch fallback, the real
#        server), no GPU needed.
# Follows, in LMCache/LMCache (dev), the multiprocess lane, the k3 lane that runs:
# .buildkite/k3_tests/multiprocess/run.sh (from the repository root, source the k3 harness's
# setup script, then install what the step needs with uv and run it). gpu sources
# .buildkite/k3_harness/setup-lmcache-only-env.sh (LMCache from source into the ci-base
# image's venv, no vLLM; it merges the PR base branch and sets the setuptools-scm override).
# cpu does what .github/scripts/run-cpu-e2e-validation.sh (the multiprocess lane's CPU-only
# step) does before it starts vLLM: a fresh `uv venv --python 3.12`, pip/setuptools/wheel
# upgraded, LMCache installed as .github/scripts/install_lmcache_cpu.sh installs it
# (NO_GPU_EXT=1, SETUPTOOLS_SCM_PRETEND_VERSION, requirements/{build,common,cli}.txt,
# `-e . --no-deps --no-build-isolation`, the gRPC bindings), after merge_pr_base_branch from
# .buildkite/k3_tests/common_scripts/helpers.sh. The CPU torch comes from PyTorch's CPU
# index, where theirs comes with the CPU vLLM (install_vllm_cpu.sh, same index): this lane
# installs no vLLM. pytest runs with LMCACHE_TRACK_USAGE=false, as LMCache's pytest lanes do.
#
# usage: run.sh gpu|cpu
# knobs: SHAREDKV_SPEC (what to install as the plugin: a wheel, as a path or URL, or a
#        pinned VCS URL, git+https://...@COMMIT; the bare name only once it is published),
#        LMCACHE_ROOT (the LMCache checkout; default: this git work tree, else .),
#        PYTHON (default python; cpu with LMCache set up: the fresh venv's),
#        PIP_BIN (as in install_lmcache_cpu.sh; default "uv pip" where uv is, else
#        "$PYTHON -m pip"), SHAREDKV_TORCH (cpu: the torch requirement; default torch),
#        SHAREDKV_ARTIFACTS (default $LMCACHE_ROOT/sharedkv-artifacts),
#        SHAREDKV_CPU_MARKERS (default "packed_page or replica_pair"),
#        SHAREDKV_SKIP_SETUP=1 (LMCache is installed already), SHAREDKV_SKIP_INSTALL=1
#        (so is the plugin), SHAREDKV_SKIP_GPU=1 (gpu: stop before the GPU tiers, green).
# exit status: 2 usage, 3 the GPU step sees no GPU, 4 the plugin cannot be installed,
#        1 a tier failed.
set -euo pipefail

mode="${1:-}"
case "$mode" in
  gpu|cpu) ;;
  *) echo "usage: $0 gpu|cpu" >&2; exit 2 ;;
esac

# PyTorch's CPU wheels: the index LMCache's install_vllm_cpu.sh takes its CPU torch from.
torch_cpu_index=https://download.pytorch.org/whl/cpu
spec="${SHAREDKV_SPEC:-}"
if [ -z "${SHAREDKV_SKIP_INSTALL:-}" ] && [ -z "$spec" ]; then
  # Said before LMCache is built: that takes minutes.
  echo "sharedkv: SHAREDKV_SPEC is not set: it names the pytest-sharedkv to install, a" \
       "wheel (a path or URL, e.g. a build artifact) or a pinned VCS URL" \
       "(git+https://HOST/OWNER/pytest-sharedkv@COMMIT). The bare name works only once the" \
       "package is on the index. Set SHAREDKV_SKIP_INSTALL=1 where it is installed already." >&2
  exit 4
fi

root="${LMCACHE_ROOT:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}"
cd "$root"
python="${PYTHON:-python}"
artifacts="${SHAREDKV_ARTIFACTS:-$root/sharedkv-artifacts}"
rm -rf "$artifacts"
mkdir -p "$artifacts"

step() { echo "--- :microscope: sharedkv ($mode): $*"; }

if [ -n "${PIP_BIN:-}" ]; then
  read -r -a pip <<< "$PIP_BIN"
elif command -v uv >/dev/null 2>&1; then
  pip=(uv pip)  # LMCache's lanes install with uv
else
  pip=("$python" -m pip)
fi

# 1. LMCache itself, from this checkout, installed editable as LMCache's own lanes do.
if [ -n "${SHAREDKV_SKIP_SETUP:-}" ]; then
  step "LMCache setup skipped (SHAREDKV_SKIP_SETUP)"
elif [ "$mode" = gpu ] && [ -f .buildkite/k3_harness/setup-lmcache-only-env.sh ]; then
  step "LMCache from source (setup-lmcache-only-env.sh)"
  # shellcheck source=/dev/null
  source .buildkite/k3_harness/setup-lmcache-only-env.sh
elif [ "$mode" = cpu ] && [ -f pyproject.toml ]; then
  # A PR build tests the PR merged into its base, as every k3 lane does.
  if [ -f .buildkite/k3_tests/common_scripts/helpers.sh ]; then
    # shellcheck source=/dev/null
    source .buildkite/k3_tests/common_scripts/helpers.sh
  fi
  if declare -F merge_pr_base_branch >/dev/null; then
    merge_pr_base_branch
  fi
  # A fresh venv per build, as run-cpu-e2e-validation.sh makes: the ci-base image's own
  # venv holds the CUDA torch of requirements/cuda.txt (ci-base.Dockerfile), not a CPU one.
  if ! command -v uv >/dev/null 2>&1; then
    echo "sharedkv: the CPU step makes a fresh venv with uv (uv venv --python 3.12, as" \
         "LMCache's run-cpu-e2e-validation.sh does), and uv is not on PATH" >&2
    exit 2
  fi
  venv="$root/.venv-sharedkv-${BUILDKITE_BUILD_ID:-local_$$}"
  if [ -e "$venv" ]; then
    echo "sharedkv: $venv exists; the CPU step makes a fresh venv and leaves that one" >&2
    exit 2
  fi
  step "a fresh venv, $venv (uv venv --python 3.12)"
  uv venv --python 3.12 "$venv"
  # shellcheck source=/dev/null
  source "$venv/bin/activate"
  python="$venv/bin/python"
  "${pip[@]}" install --upgrade pip setuptools wheel
  step "torch, CPU build (${SHAREDKV_TORCH:-torch} from $torch_cpu_index)"
  "${pip[@]}" install "${SHAREDKV_TORCH:-torch}" --index-url "$torch_cpu_index"
  step "LMCache from source without GPU extensions (as install_lmcache_cpu.sh)"
  # Not install_lmcache_cpu.sh itself: it ends by importing vllm, which this lane has not.
  export NO_GPU_EXT=1
  # setuptools-scm would read LMCache's non-PEP-440 tags (nightly, nightly-cu13) and the
  # build would fail; install_lmcache_cpu.sh pins the version the same way.
  export SETUPTOOLS_SCM_PRETEND_VERSION="${SETUPTOOLS_SCM_PRETEND_VERSION:-0.0.0.dev0}"
  for requirements in requirements/build.txt requirements/common.txt requirements/cli.txt; do
    if [ -f "$requirements" ]; then
      "${pip[@]}" install -r "$requirements"
    fi
  done
  # --no-deps: torch stays the CPU build installed above
  "${pip[@]}" install -e . --no-deps --no-build-isolation
  grpc=lmcache/v1/multiprocess/transport/grpc_impl
  if [ -f "$grpc/protos/generate.py" ]; then
    step "LMCache gRPC bindings ($grpc/protos/generate.py)"
    "$python" "$grpc/protos/generate.py"
  elif [ -f "$grpc/_proto_gen/_generate.py" ]; then
    step "LMCache gRPC bindings ($grpc/_proto_gen/_generate.py)"
    if [ -f requirements/proto.txt ]; then
      "${pip[@]}" install -r requirements/proto.txt
    fi
    "$python" -m lmcache.v1.multiprocess.transport.grpc_impl._proto_gen._generate
  fi
fi

# 2. The plugin, without its [lmcache] extra: the LMCache under test stays as installed.
if [ -n "${SHAREDKV_SKIP_INSTALL:-}" ]; then
  step "plugin install skipped (SHAREDKV_SKIP_INSTALL)"
else
  step "installing SHAREDKV_SPEC=$spec"
  if ! "${pip[@]}" install "$spec"; then
    echo "sharedkv: SHAREDKV_SPEC=$spec could not be installed (${pip[*]} install failed," \
         "above). Give a wheel that exists (a path or URL) or a pinned VCS URL" \
         "(git+https://HOST/OWNER/pytest-sharedkv@COMMIT); the bare name works only once the" \
         "package is on the index." >&2
    exit 4
  fi
fi
"$python" - <<'PY'
import importlib.metadata as md
import importlib.util
import sys
missing = [m for m in ("lmcache", "pytest_sharedkv") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"sharedkv: not importable: {', '.join(missing)}")
print("sharedkv: lmcache", md.version("lmcache"), "| pytest-sharedkv", md.version("pytest-sharedkv"))
PY

# 3. The GPU step needs one GPU; say so plainly where there is none.
if [ "$mode" = gpu ]; then
  if [ -n "${SHAREDKV_SKIP_GPU:-}" ]; then
    step "GPU tiers skipped (SHAREDKV_SKIP_GPU=$SHAREDKV_SKIP_GPU)"
    exit 0
  fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    seen="nvidia-smi not found"
  else
    seen="$(nvidia-smi -L 2>&1 | grep -c '^GPU ' || true) GPU(s) listed by nvidia-smi -L"
  fi
  case "$seen" in
    [1-9]*) ;;
    *) echo "sharedkv: the GPU step needs 1 GPU and sees none ($seen). Run it on a GPU" \
            "agent (nvidia.com/gpu: 1), or set SHAREDKV_SKIP_GPU=1 to skip it." >&2
       exit 3 ;;
  esac
fi

# 4. The tiers. Each run leaves its JSON, terminal log, server and replica logs under
# $artifacts, and its sharedkv summary (Markdown tables) as a Buildkite annotation.
status=0
run_tiers() {
  local name="$1" rc=0
  shift
  step "$name"
  set +e
  LMCACHE_TRACK_USAGE=false "$@" --sharedkv-json "$artifacts/$name.json" \
    --basetemp "$artifacts/tmp-$name" -p no:cacheprovider 2>&1 | tee "$artifacts/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  {
    echo "#### pytest-sharedkv: $name ($mode), exit status $rc"
    echo
    awk '/^=+ sharedkv summary =+$/ { on = 1; next } on && /^=+ .* =+$/ { on = 0 }
         on && !/^JSON report/' "$artifacts/$name.log"
  } > "$artifacts/$name.md"
  if command -v buildkite-agent >/dev/null 2>&1; then
    local style=success
    [ "$rc" -eq 0 ] || style=error
    buildkite-agent annotate --style "$style" --context "sharedkv-$name" < "$artifacts/$name.md"
  else
    echo "sharedkv: no buildkite-agent here; the annotation is $artifacts/$name.md"
  fi
  [ "$rc" -eq 0 ] || status=1
}

if [ "$mode" = gpu ]; then
  # The multiprocess lane's pod leaves CUDA_LAUNCH_BLOCKING alone, but the unit lane's set
  # it to 1 and an agent may too: with it every launch is synchronous, the ordering tier
  # could not see a stream-ordering fault, and a delayed transfer would be over before its
  # copy starts. Every GPU tier runs without it.
  run_tiers ordering env -u CUDA_LAUNCH_BLOCKING "$python" -m pytest_sharedkv -m ordering \
    --sharedkv-require-gpu
  run_tiers kv env -u CUDA_LAUNCH_BLOCKING "$python" -m pytest_sharedkv \
    -m "packed_page or pinned_pool or replica_pair" -k "not cross_replica" \
    --sharedkv-require-gpu --sharedkv-inject-delay 1e8
else
  run_tiers cpu "$python" -m pytest_sharedkv -m "${SHAREDKV_CPU_MARKERS:-packed_page or replica_pair}" \
    -k "not cross_replica"
fi
exit "$status"
