# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): the delayed producer on LMCache 0.5.6's torch
# fallback, mixed, in what a session has left after another plan (~600 s with the machine's
# start): the catalogue's test alone (its pass is the gate and 3k, 24 measured requests)
# and a delay of 1e7 cycles, a tenth of the default, because on the fallback the delay sits
# before every per-layer kernel (fallback-mixed-delay.sh is the full cell). Ran on
# 2026-12-03: 305 s, the cell 96 s (service-0.5.6-fallback-mixed-delay-short).
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
SHAREDKV_SERVICE_MEASURED=24 lane fb-mixed-delay-short 370 0.5.6 -m service_regression \
  -k fault_catalogue --sharedkv-service-sizes 3k --sharedkv-allocators mixed \
  --sharedkv-fault-catalogue delayed-producer --sharedkv-delay-cycles 10000000 \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
