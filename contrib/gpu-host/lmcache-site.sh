#!/usr/bin/env bash
# One LMCache release in a site directory of its own, layered over the staged vLLM, so that
# several releases (and kernel paths) share one GPU host:
#   lmcache-site.sh install VERSION WHEEL_DIR           -> /tmp/site-lmcache-VERSION (its wheel, --no-deps)
#   lmcache-site.sh compile VERSION SDIST               -> builds cuda_ops there against this torch
#   lmcache-site.sh run VERSION PYTEST_SUITE_ARGS...    -> python3 -m pytest_sharedkv ... with that LMCache
# vLLM and the shared dependencies live in /tmp/site (README.md beside this file, steps 1-3).
# The suite's header, its JSON report (environment.lmcache) and the stored-reference key then
# name the release and its kernel path (compiled cuda_ops / c_ops, or the torch fallback and why).
set -euo pipefail
BASE=${SHAREDKV_BASE_SITE:-/tmp/site}
here=$(cd "$(dirname "$0")" && pwd)

site_of() { echo "${SHAREDKV_SITES:-/tmp}/site-lmcache-$1"; }

cmd=${1:-}
[ $# -ge 2 ] || { echo "usage: $0 install|compile|run VERSION ..." >&2; exit 2; }
version=$2
site=$(site_of "$version")
shift 2
case "$cmd" in
  install)
    wheels=${1:?wheel directory}
    mkdir -p "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      "$wheels"/lmcache-"$version"-*.whl
    ;;
  compile)
    # Builds only the CUDA extension (csrc/), sm_90, against the torch python3 has here;
    # the wheel's own cuda_ops (built for another torch) is kept beside it as .wheel.
    sdist=${1:?LMCache source release (.tar.gz)}
    work=$(mktemp -d)
    tar -xzf "$sdist" -C "$work"
    src=$(find "$work" -maxdepth 1 -type d -name 'lmcache-*' | head -n 1)
    mkdir -p "$work/empty"
    (cd "$work/empty" && LMC_SRC=$src TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
      MAX_JOBS=${MAX_JOBS:-16} python3 "$here/build_cuda_ops.py" build_ext \
      --build-lib "$work/lib" --build-temp "$work/tmp")
    built=$(ls "$work"/lib/lmcache/cuda_ops*.so)
    target="$site/lmcache/$(basename "$built")"
    [ ! -f "$target" ] || [ -f "$target.wheel" ] || mv "$target" "$target.wheel"
    cp "$built" "$target"
    sha256sum "$target"
    ;;
  run)
    # SHAREDKV_EXTRA_SITE (an SGLang lane's site, sglang-site.sh) goes first
    export PYTHONPATH="${SHAREDKV_EXTRA_SITE:+$SHAREDKV_EXTRA_SITE:}$site:$BASE${PYTHONPATH:+:$PYTHONPATH}"
    # the L2 checks' redis-server, where redis-site.sh installed one
    redis=${SHAREDKV_REDIS_SITE:-/tmp/redis-site}/bin
    [ ! -x "$redis/redis-server" ] || export PATH="$redis:$PATH"
    exec python3 -m pytest_sharedkv -p syrupy "$@"
    ;;
  *)
    echo "usage: $0 install|compile|run VERSION ..." >&2
    exit 2
    ;;
esac
