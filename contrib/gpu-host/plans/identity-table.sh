# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN), issue 50's GPU table: the identity tier's
# pairs on the MP server and on vLLM's native offload (the "one other stack").
#
# NOT RUNNABLE YET: the tier collects its CPU stacks only (stub, transfer); the GPU
# stacks' rows are in identity/table.py with the reason "planned". To build first, in a
# new module identity/gpu_cells.py (launch code in stack/, a new module): a vLLM pair
# through providers.launch_vllm_pair per side, replica B launched with the other identity:
#   weights     --sharedkv-identity-model DIR: the copy model made with another codebook
#               (make-model --kind copy, another seed), served under the same name
#   rope        --hf-overrides '{"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}'
#   kv dtype    --kv-cache-dtype fp8 (H100/H200)
#   lora        --enable-lora --lora-modules a=--sharedkv-identity-lora (a LoRA for the
#               model's architecture; the copy model has none: say which model carries it)
#   chunk       the server's --chunk-size 256 against 512 on one pool
#   salt        the stub protocol as is (cache_salt on the request)
# each judged by identity/judge.py as on CPU: the same identity hits and answers exactly,
# another does not hit or answers as its own cold request.
# Once built, these lanes run it (about 15 min each on one H100):
VA='--gpu-memory-utilization 0.05 --kv-cache-memory-bytes 4294967296'
lane identity-mp 900 0.5.6 -m identity --sharedkv-require-gpu --sharedkv-vllm-args "$VA"
lane identity-native 900 0.5.6 -m identity --sharedkv-stack native --sharedkv-require-gpu \
  --sharedkv-vllm-args "$VA"
