#!/usr/bin/env bash
# Several suite runs on one GPU at once, started detached after the staging transfers:
#   setsid nohup bash contrib/gpu-host/service-wave.sh PLAN &
# PLAN is a bash file of lines such as
#   compile 0.5.6                      # LMCache's cuda_ops for the runs after it (stops them if it fails)
#   fallback 0.5.6 0.5.6fb             # a copy of the wheel's site as released, made before compile
#   lane NAME LIMIT_S SITE SUITE-ARGS...
#   SHAREDKV_SERVICE_MEASURED=8 lane NAME LIMIT_S SITE SUITE-ARGS...
#   sglang_lane NAME LIMIT_S SITE SUITE-ARGS...   # SGLang replicas; not run (said) without
#                                                 # a complete sglang-site.sh install
# Each lane runs `lmcache-site.sh run SITE SUITE-ARGS --basetemp DIR --sharedkv-json
# $R/NAME.json` in the background under `timeout LIMIT_S` with a runtime directory of its
# own (SHAREDKV_RUNTIME_DIR): the suite's GPU lease admits one run per GPU and runtime
# directory, so lanes that share one would run one after another. Lanes start STAGGER_S
# apart. $R (default /tmp/res) gets NAME.json, NAME.log, NAME-logs.tar.gz (the engines'
# and servers' logs) and progress.txt, whose last line is "alldone".
# Give a lane the GPU memory it may use (e.g. --sharedkv-vllm-args '--gpu-memory-utilization
# 0.05 --kv-cache-memory-bytes 4294967296'): the engines' own sizing assumes a GPU of their own.
set -u
plan=${1:?usage: service-wave.sh PLAN}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.." || exit 2  # the checkout: the suite runs from its root
R=${SHAREDKV_RESULTS:-/tmp/res}; mkdir -p "$R"
SDIST=${SDIST:-$here/../../.stage/sdist/lmcache-0.5.6.tar.gz}
STAGGER_S=${STAGGER_S:-15}
T=${WAVE_TMP:-/tmp}  # the lanes' runtime and base directories
export PYTHONUNBUFFERED=1
stamp() { echo "$(date +%s) $*" >> "$R/progress.txt"; }
started=0
ok=1

compile() {  # VERSION: LMCache's cuda_ops against this torch, for the lanes after it
  local t0; t0=$(date +%s)
  if bash "$here/lmcache-site.sh" compile "$1" "$SDIST" > "$R/compile-$1.log" 2>&1; then
    stamp "compile $1 rc=0 wall=$(( $(date +%s) - t0 ))"
  else
    stamp "compile $1 failed (compile-$1.log): the lanes after it are not run"; ok=0
  fi
}

fallback() {  # VERSION NAME: the wheel's site as released, copied before compile
  local sites=${SHAREDKV_SITES:-/tmp}  # where lmcache-site.sh keeps each release's site
  cp -a "$sites/site-lmcache-$1" "$sites/site-lmcache-$2" && stamp "fallback $2 from $1"
}

lane() {  # NAME LIMIT_S SITE SUITE-ARGS...
  local name=$1 limit=$2 site=$3; shift 3
  if [ "$ok" != 1 ]; then stamp "$name not run"; return; fi
  [ "$started" = 0 ] || sleep "$STAGGER_S"  # each lane STAGGER_S after the one before
  started=1
  (
    runtime="$T/rt-$name"; mkdir -p "$runtime"; chmod 700 "$runtime"
    bt=$(mktemp -d "$T/bt-$name-XXXX")
    t0=$(date +%s); stamp "$name start"
    SHAREDKV_RUNTIME_DIR=$runtime timeout -s TERM "$limit" bash "$here/lmcache-site.sh" run \
      "$site" "$@" --basetemp "$bt" --sharedkv-json "$R/$name.json" > "$R/$name.log" 2>&1
    stamp "$name rc=$? wall=$(( $(date +%s) - t0 ))"
    find "$bt" -name '*.log' -size -40M -print0 \
      | tar -czf "$R/$name-logs.tar.gz" --null -T - 2>/dev/null
  ) &
}

sglang_lane() {  # NAME LIMIT_S SITE SUITE-ARGS...: a lane on SGLang replicas (sglang-site.sh)
  if ! bash "$here/sglang-site.sh" check 2>/dev/null; then
    stamp "$1 not run: no complete SGLang site (a staging part did not land)"; return
  fi
  SHAREDKV_EXTRA_SITE=${SHAREDKV_SGLANG_SITE:-/tmp/site-sglang} lane "$@" --sharedkv-engine sglang
}

stamp start
# A staging transfer refused (no machine, a call over 64 MiB) leaves the vLLM bundle unpacked
# while the calls after it still run: every lane would fail at once for want of vLLM
# (2026-12-03: 80 tests failed in 96 s). Say so and run nothing.
base=${SHAREDKV_BASE_SITE:-/tmp/site}
if [ ! -f "$base/vllm/__init__.py" ]; then
  stamp "no vLLM in $base (a staging transfer did not land): no lane run"; stamp alldone
  exit 3
fi
# shellcheck source=/dev/null
source "$plan"
wait
stamp alldone
