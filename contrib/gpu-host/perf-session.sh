#!/usr/bin/env bash
# One session of the real-compute perf screening on the one-GPU H200 (README.md beside this
# file, "The perf tier at real compute"), started detached after the three staging transfers:
#   setsid nohup bash contrib/gpu-host/perf-session.sh NAME [SUITE-ARGS...] &
# builds LMCache 0.5.6's cuda_ops against this torch (SDIST: the cut source release that
# make-bundles.sh writes), runs one block pair with the flags every session of one screening
# shares (merge-screenings refuses runs whose engine flags, sizes or model differ), and
# leaves in /tmp/res: NAME.json, NAME.log, the plots, the engines' and server's logs and a
# progress file whose last line is "done". SUITE-ARGS come last (for example
# --sharedkv-perf-arms NATIVE for an OFF-NATIVE pair).
set -u
name=${1:?usage: perf-session.sh NAME [SUITE-ARGS...]}; shift
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.." || exit 2  # the checkout: the suite runs from its root
R=${SHAREDKV_RESULTS:-/tmp/res}; mkdir -p "$R"
SDIST=${SDIST:-$here/../../.stage/sdist/lmcache-0.5.6.tar.gz}
export PYTHONUNBUFFERED=1
stamp() { echo "$(date +%s) $*" >> "$R/progress.txt"; }
stamp start
base=${SHAREDKV_BASE_SITE:-/tmp/site}  # a staging transfer refused leaves no vLLM there
if [ ! -f "$base/vllm/__init__.py" ]; then
  stamp "no vLLM in $base (a staging transfer did not land): nothing run"; stamp "done"
  exit 3
fi
t0=$(date +%s)
# without the built cuda_ops LMCache runs its torch fallback: another stack, which
# merge-screenings refuses beside compiled sessions; stop here instead
if ! bash "$here/lmcache-site.sh" compile 0.5.6 "$SDIST" > "$R/compile.log" 2>&1; then
  stamp "compile failed (see compile.log): nothing run"
  stamp "done"
  exit 1
fi
stamp "compile rc=0 wall=$(( $(date +%s) - t0 ))"
t0=$(date +%s)
bt=$(mktemp -d /tmp/bt-XXXX)
timeout 1500 bash "$here/lmcache-site.sh" run 0.5.6 -m perf --sharedkv-perf-model 27b-compute \
  --sharedkv-service-sizes 8k,32k,128k --sharedkv-blocks 1 --sharedkv-require-gpu \
  --basetemp "$bt" --sharedkv-json "$R/$name.json" "$@" > "$R/$name.log" 2>&1
stamp "perf rc=$? wall=$(( $(date +%s) - t0 ))"
find "$bt" -name '*.log' -print0 | tar -czf "$R/$name-engine-logs.tar.gz" --null -T - 2>/dev/null
stamp "done"
