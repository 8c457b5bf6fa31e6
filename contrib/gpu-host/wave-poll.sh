#!/usr/bin/env bash
# One poll of a detached service wave (service-wave.sh) or perf session (perf-session.sh),
# for a device call: waits up to LIMIT_S for the progress file's last line ("alldone", or a
# perf session's "done"), then puts what has finished into $OUT (progress.txt, res.tar.gz
# with every report and log, and up to five lanes' engine logs under 15 MB each: eight
# files at most come back from a call) and prints the progress, memory and GPU use.
lim=${1:-540}; R=${SHAREDKV_RESULTS:-/tmp/res}; t0=$(date +%s)
until tail -n 1 "$R/progress.txt" 2>/dev/null | grep -qE ' (all)?done$' || [ $(( $(date +%s) - t0 )) -ge "$lim" ]; do
  sleep 5
done
cp "$R/progress.txt" "$OUT/" 2>/dev/null
tar -czf "$OUT/res.tar.gz" -C "$R" --exclude='*-logs.tar.gz' . 2>/dev/null
for f in "$R"/*-logs.tar.gz; do
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 15000000 ] && cp "$f" "$OUT/"
  [ "$(find "$OUT" -maxdepth 1 -name '*-logs.tar.gz' | wc -l)" -ge 5 ] && break
done
cat "$R/progress.txt" 2>/dev/null
free -g | head -2
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv 2>/dev/null || true  # none on CPU
