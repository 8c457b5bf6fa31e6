# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): the fault catalogue's delayed-producer class
# on LMCache 0.5.6's torch fallback (the wheel as released, no compile line), mixed
# allocator, alone on the GPU. Compiled lazy and compiled mixed have their cells
# (service-0.5.6-compiled-lazy-delay, service-0.5.6-compiled-mixed-delay).
# On the fallback the delay also sits in every per-layer kernel and copy helper (3,193
# delayed calls in 19 transfers, each 3,008-token store 19.2 s:
# service-0.5.6-fallback-mixed-delay-2-cut), so its cell alone takes minutes after a pass of
# ~280 s: the lane gets 1,000 s (470 s and a lost machine cut it twice after its cold step).
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
lane fb-mixed-delay 1000 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-allocators mixed --sharedkv-fault-catalogue delayed-producer \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
