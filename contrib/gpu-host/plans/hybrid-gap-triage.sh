# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): issue 48's L2 gap cell and its controls
# (about 7 minutes of wave; ran on an H100 on 2026-12-08, the lanes 267-394 s:
# docs/findings/2026-12-08-h100-hybrid-gap-controls.md): the base cell as this session's
# positive control,
# concurrency 1 alone, --max-num-seqs 1 alone, and the attention-only copy model (made
# before the wave: `python3 -m pytest_sharedkv make-model --kind copy-attention
# /tmp/copy-attention`).
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
