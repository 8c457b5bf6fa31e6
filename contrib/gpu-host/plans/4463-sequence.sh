# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN), alone on the GPU: LMCache #4463's later
# report in its own condition, four identical greedy requests sent one after another
# (test_identical_requests_in_sequence), beside the same requests in flight together, on
# its configuration: the in-process connector, each replica's own local_cpu (8 GiB), no
# remote, vLLM's prefix cache off. Needs the attention-only copy model at /tmp/ca first
# (`python -m pytest_sharedkv make-model --kind copy-attention /tmp/ca`, the session's
# command before this wave), as the in-process runs of 2026-12-03 had.
compile 0.5.6
lane f4463-seq 900 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-stack inprocess --sharedkv-model /tmp/ca --sharedkv-inprocess-remote none \
  --no-sharedkv-inprocess-prefix-caching --sharedkv-inprocess-cpu-gib 8 \
  -k "in_sequence or in_flight" --sharedkv-require-gpu
