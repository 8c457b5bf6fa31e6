# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): the fault catalogue's delayed-producer
# class on the mixed allocator, compiled and torch fallback side by side (compiled lazy
# has its result: service-0.5.6-compiled-lazy-delay, 445 s alone). The fallback's copy is
# made before the compile line replaces the wheel's cuda_ops.
# On the fallback the delay also sits in every per-layer kernel and copy helper (3,193
# delayed calls in 19 transfers, each 3,008-token store 19.2 s:
# service-0.5.6-fallback-mixed-delay-2-cut), so its cell alone takes minutes after a pass of
# ~280 s: its lane gets 1,000 s (470 s and a lost machine cut it twice after its cold step).
fallback 0.5.6 0.5.6fb
compile 0.5.6
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
lane fb-mixed-delay 1000 0.5.6fb -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-allocators mixed --sharedkv-fault-catalogue delayed-producer \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
lane c-mixed-delay 700 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-allocators mixed --sharedkv-fault-catalogue delayed-producer \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
