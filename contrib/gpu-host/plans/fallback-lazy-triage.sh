# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): LMCache 0.5.6's torch fallback (the wheel
# as released, no compile line), lazy allocator, the triage to its verdict line, alone on
# the GPU. On 2026-12-03 a relaunched pair took 110-160 s to start with three runs on the
# GPU, and no run reached the verdict (six relaunched pairs); 24 measured requests keep
# each cell's requests short. The lane's limit ends before a session's budget does after
# the machine's start and the four staging transfers.
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
SHAREDKV_SERVICE_MEASURED=24 lane fb-lazy-triage 1250 0.5.6 -m service_regression \
  --sharedkv-service-sizes 3k --sharedkv-allocators lazy --sharedkv-triage \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
