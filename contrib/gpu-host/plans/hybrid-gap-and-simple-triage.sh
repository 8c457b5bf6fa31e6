# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): the controls that separate causes, two
# classes in one session.
# 1. Issue 48's L2 gap cell (hosts, fs, compiled 0.5.6, mixed, 8 measured 3k requests, the
#    cell alone): the base cell as this session's positive control (3k-004 wrong on
#    2026-12-02), then concurrency 1 alone, --max-num-seqs 1 alone, and the attention-only
#    copy model (made before the wave: `python3 -m pytest_sharedkv make-model --kind
#    copy-attention /tmp/copy-attention`). The 128-token-steps control ran on 2026-12-02
#    (hosts-0.5.6-compiled-fault-gap-aligned-steps).
# 2. The simple connector's wrong session turn (vLLM #45704 / #47282): the base pass as this
#    session's positive control, CUDA_LAUNCH_BLOCKING=1 in both replicas, one request in
#    flight (--sharedkv-concurrency 1).
# Each lane has its own runtime directory (service-wave.sh), so all run on the one GPU.
compile 0.5.6
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 2147483648'
GAP=(-m service_regression -k test_l2_fault_gap --sharedkv-topology hosts --sharedkv-l2 fs
     --sharedkv-allocators mixed --sharedkv-service-sizes 3k --sharedkv-l2-fault-gap 4
     --sharedkv-require-gpu)
SHAREDKV_SERVICE_MEASURED=8 lane gap4-base 900 0.5.6 "${GAP[@]}" --sharedkv-vllm-args "$VA"
SHAREDKV_SERVICE_MEASURED=8 lane gap4-conc1 900 0.5.6 "${GAP[@]}" --sharedkv-concurrency 1 \
  --sharedkv-vllm-args "$VA"
SHAREDKV_SERVICE_MEASURED=8 lane gap4-seqs1 900 0.5.6 "${GAP[@]}" \
  --sharedkv-vllm-args "$VA --max-num-seqs 1"
SHAREDKV_SERVICE_MEASURED=8 lane gap4-attention 900 0.5.6 "${GAP[@]}" \
  --sharedkv-model /tmp/copy-attention --sharedkv-vllm-args "$VA"
SIMPLE=(-m service_regression --sharedkv-stack native --sharedkv-native-connector simple
        --sharedkv-service-sizes 3k --sharedkv-require-gpu --sharedkv-vllm-args
        '--gpu-memory-utilization 0.05')
lane simple-base 1000 0.5.6 "${SIMPLE[@]}"
CUDA_LAUNCH_BLOCKING=1 lane simple-launch-blocking 1000 0.5.6 "${SIMPLE[@]}"
lane simple-one-in-flight 1000 0.5.6 "${SIMPLE[@]}" --sharedkv-concurrency 1
