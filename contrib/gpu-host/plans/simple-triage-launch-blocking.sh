# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN), alone on the GPU: vLLM #45704 / #47282's
# triage on the simple connector (SimpleCPUOffloadConnector, vLLM 0.26.0, no LMCache),
# the control CUDA_LAUNCH_BLOCKING=1: every launch synchronous in the suite and in the
# replicas it starts (they inherit its environment; the report's environment header says
# whether CUDA_LAUNCH_BLOCKING was on: a run without it there is no control). Four runs
# without it answered one session turn on B wrong each (native-simple-vllm-0.26.0*): a
# wrong turn gone here points at ordering, the load path's missing cross-stream sync
# (#47282); one still there does not. One request in flight is the other plan
# (simple-triage-one-in-flight.sh); a synchronize after the load needs a hook in vLLM's
# DmaCopyBackend that is not built.
CUDA_LAUNCH_BLOCKING=1 lane simple-clb 1500 0.5.6 -m service_regression \
  --sharedkv-service-sizes 3k --sharedkv-stack native --sharedkv-native-connector simple \
  --sharedkv-require-gpu
