# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): the simple connector's wrong session turn
# (vLLM #45704 / #47282; one of 48 turns on B wrong in each of four H200 runs, 2026-12-03),
# the controls that separate a load-path race: the base pass as this session's positive
# control, CUDA_LAUNCH_BLOCKING=1 in both replicas, one request in flight
# (--sharedkv-concurrency 1). A synchronize after the load needs a hook in vLLM's
# DmaCopyBackend, not built. Three full service passes on the native stack at once (each
# ~520 s alone on the H200).
SIMPLE=(-m service_regression --sharedkv-stack native --sharedkv-native-connector simple
        --sharedkv-service-sizes 3k --sharedkv-require-gpu --sharedkv-vllm-args
        '--gpu-memory-utilization 0.05')
lane simple-base 1000 0.5.6 "${SIMPLE[@]}"
CUDA_LAUNCH_BLOCKING=1 lane simple-launch-blocking 1000 0.5.6 "${SIMPLE[@]}"
lane simple-one-in-flight 1000 0.5.6 "${SIMPLE[@]}" --sharedkv-concurrency 1
