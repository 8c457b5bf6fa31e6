# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN) for issue 48, NOT YET RUN: the memory copy
# model (make-model --kind copy-memory: a Gated DeltaNet memory of the prompt's first word,
# so a zeroed, foreign or rewritten recurrent state resumed anywhere after it answers
# <miss>) through the service tier on compiled LMCache 0.5.6, mixed and lazy, the state
# oracle on (its default: every recurrent-state load B makes judged against the model's
# CPU reference, a load with none fails), then the recurrent-state triage's controls
# (service/state_triage.py) as lanes of their own: scheduler steps at every chunk, one
# sequence alone, concurrency 1, the attention-only model. Each lane's wall time is in
# progress.txt. Not in this plan (not wired yet, said in docs/tiers/service_regression.md):
# the boundary corpus's step (corpus/boundary_corpus.py) and the 27b-compute count
# (stack/kv_audit.unkept_by_size), which needs the perf tier to launch with the audit.
# The models are made before the wave, as plans/hybrid-gap-triage.sh's:
# `python3 -m pytest_sharedkv make-model --kind copy-memory /tmp/copy-memory` and
# `... --kind copy-attention /tmp/copy-attention`.
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
M=/tmp/copy-memory
compile 0.5.6
lane mem-mixed 900 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-model "$M" --sharedkv-allocators mixed --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
lane mem-lazy 900 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-model "$M" --sharedkv-allocators lazy --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
lane mem-steps-every-chunk 900 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-model "$M" --sharedkv-allocators mixed --sharedkv-require-gpu \
  --sharedkv-vllm-args "$VA --max-num-batched-tokens 32 --max-num-seqs 1"
lane mem-one-sequence 900 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-model "$M" --sharedkv-allocators mixed --sharedkv-require-gpu \
  --sharedkv-vllm-args "$VA --max-num-seqs 1"
lane mem-concurrency-1 900 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-model "$M" --sharedkv-allocators mixed --sharedkv-require-gpu --sharedkv-concurrency 1 \
  --sharedkv-vllm-args "$VA"
lane attention-only 900 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-model /tmp/copy-attention --sharedkv-allocators mixed \
  --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
