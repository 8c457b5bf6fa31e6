# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN), alone on the GPU: vLLM #45704 / #47282's
# triage on the simple connector, the control one request in flight
# (--sharedkv-concurrency 1: no load overlapping another request's work). Four runs at the
# pass's concurrency answered one session turn on B wrong each; a wrong turn gone here
# points at requests overlapping, one still there does not. See
# simple-triage-launch-blocking.sh for the other control.
lane simple-one 1500 0.5.6 -m service_regression --sharedkv-service-sizes 3k \
  --sharedkv-stack native --sharedkv-native-connector simple --sharedkv-concurrency 1 \
  --sharedkv-require-gpu
