# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): the fault catalogue's delayed-producer
# class on the mixed allocator, compiled and torch fallback side by side (compiled lazy
# has its result: service-0.5.6-compiled-lazy-delay, 445 s alone). The fallback's copy is
# made before the compile line replaces the wheel's cuda_ops.
fallback 0.5.6 0.5.6fb
compile 0.5.6
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
lane c-mixed-delay 700 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-allocators mixed --sharedkv-fault-catalogue delayed-producer \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
lane fb-mixed-delay 700 0.5.6fb -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-allocators mixed --sharedkv-fault-catalogue delayed-producer \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
# Beside them (no LMCache): vLLM's SimpleCPUOffloadConnector without the gate hook in B,
# the control for the one wrong session turn each of its three runs answered with the hook
# loaded (docs/field-reports.md, #45704); 517 s alone beside two other runs on 2026-12-03.
lane native-simple-no-gate 700 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-stack native --sharedkv-native-connector simple --no-sharedkv-gate \
  --sharedkv-require-gpu --sharedkv-vllm-args '--gpu-memory-utilization 0.05'
