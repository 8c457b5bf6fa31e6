# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): issue 35's two remaining cells in one
# session. The fallback's lazy triage (24 measured requests) on a copy of the wheel's site
# made before the compile line, started first so its relaunched pairs meet only one other
# run; beside it the delayed producer on compiled mixed. Ran on 2026-12-03: the triage
# 794 s to its verdict (a relaunched cell 71-84 s), the compiled lane 389 s
# (service-0.5.6-fallback-lazy-triage, service-0.5.6-compiled-mixed-delay).
fallback 0.5.6 0.5.6fb
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
SHAREDKV_SERVICE_MEASURED=24 lane fb-lazy-triage 1300 0.5.6fb -m service_regression \
  --sharedkv-service-sizes 3k --sharedkv-allocators lazy --sharedkv-triage \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
compile 0.5.6
lane c-mixed-delay 700 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-allocators mixed --sharedkv-fault-catalogue delayed-producer \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
