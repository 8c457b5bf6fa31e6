#!/usr/bin/env bash
# pytest-sharedkv lane for LMCache's Buildkite CI: does LMCache move KV bytes correctly?
#   gpu: the ordering tier (every KV copy path honours the current CUDA stream), then
#        packed_page, pinned_pool and the transfer provider (the real LMCache server
#        between two processes, per allocator, with a delay), all with
#        --sharedkv-require-gpu (a lane that cannot test must not go green) and all with
#        CUDA_LAUNCH_BLOCKING unset (the pod sets it, as the unit lane does).
#   cpu: packed_page and the transfer provider on CPU (LMCache's torch fallback, the real
#        server), no GPU needed.
# Follows, in LMCache/LMCache: .buildkite/k3_tests/unit/run.sh (gpu: source
# .buildkite/k3_harness/setup-lmcache-only-env.sh, which also merges the PR base branch and
# sets the setuptools-scm version override; run pytest; `buildkite-agent annotate`) and,
# for the cpu install, .github/scripts/install_lmcache_cpu.sh (NO_GPU_EXT=1,
# SETUPTOOLS_SCM_PRETEND_VERSION, requirements/{build,common,cli}.txt, `-e . --no-deps
# --no-build-isolation`, the gRPC bindings; .github/scripts/run-cpu-e2e-validation.sh runs
# it with PIP_BIN="uv pip"), after merge_pr_base_branch from
# .buildkite/k3_tests/common_scripts/helpers.sh, as setup-lmcache-only-env.sh does.
#
# usage: run.sh gpu|cpu
# knobs: LMCACHE_ROOT (the LMCache checkout; default: this git work tree, else .),
#        PYTHON (default python), PIP_BIN (as in install_lmcache_cpu.sh; default "uv pip"
#        where uv is, else "$PYTHON -m pip"), SHAREDKV_SPEC (what to pip install; default
#        pytest-sharedkv), SHAREDKV_ARTIFACTS (default $LMCACHE_ROOT/sharedkv-artifacts),
#        SHAREDKV_CPU_MARKERS (default "packed_page or replica_pair"),
#        SHAREDKV_SKIP_SETUP=1 (LMCache is installed already), SHAREDKV_SKIP_INSTALL=1
#        (so is the plugin), SHAREDKV_SKIP_GPU=1 (gpu: stop before the GPU tiers, green).
set -euo pipefail

mode="${1:-}"
case "$mode" in
  gpu|cpu) ;;
  *) echo "usage: $0 gpu|cpu" >&2; exit 2 ;;
esac

root="${LMCACHE_ROOT:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}"
cd "$root"
python="${PYTHON:-python}"
spec="${SHAREDKV_SPEC:-pytest-sharedkv}"
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
  step "LMCache from source without GPU extensions (as install_lmcache_cpu.sh)"
  # Not install_lmcache_cpu.sh itself: it ends by importing vllm, which this lane has not.
  export NO_GPU_EXT=1
  # setuptools-scm would read LMCache's non-PEP-440 tags (nightly, nightly-cu13) and the
  # build would fail; install_lmcache_cpu.sh pins the version the same way.
  export SETUPTOOLS_SCM_PRETEND_VERSION="${SETUPTOOLS_SCM_PRETEND_VERSION:-0.0.0.dev0}"
  "${pip[@]}" install --upgrade pip
  for requirements in requirements/build.txt requirements/common.txt requirements/cli.txt; do
    if [ -f "$requirements" ]; then
      "${pip[@]}" install -r "$requirements"
    fi
  done
  # --no-deps: torch stays the one the image has (the CPU ci-base torch)
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
  step "installing $spec"
  "${pip[@]}" install "$spec"
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
  "$@" --sharedkv-json "$artifacts/$name.json" --basetemp "$artifacts/tmp-$name" -p no:cacheprovider \
    2>&1 | tee "$artifacts/$name.log"
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
  # LMCache's unit lane sets CUDA_LAUNCH_BLOCKING=1 (and so does this pod), which makes
  # every launch synchronous: the ordering tier could not see a stream-ordering fault, and
  # a delayed transfer would be over before its copy starts. Every GPU tier runs without it.
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
