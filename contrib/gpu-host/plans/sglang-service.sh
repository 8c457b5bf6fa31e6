# shellcheck shell=bash
# A service wave's plan (service-wave.sh PLAN): issue 53, the service tier on SGLang 0.5.17
# replicas over one LMCache 0.5.6 MP server (compiled cuda_ops, mixed allocator), the
# attention-only copy model (SGLang builds no LMCache radix cache for a GDN hybrid), after
# the SGLang staging (make-sglang-bundle.sh parts, sglang-site.sh install). Not yet run.
# Field-report rows it makes the condition of:
# - SGLang #37160 / LMCache #4825 (the LMCache path drops cache_salt): the protocol check
#   cache-salt-separates-namespaces-across-replicas stores a prompt on A under one salt and
#   asks B under another; B's own radix cache is salted (extra_key) and empty, so any hit
#   is LMCache's: reproduced where that check fails with cached tokens > 0 (condition: the
#   cross request reached B's LMCache lookup, its hit line in B's log).
# - SGLang #39830 (hierarchical cache, wrong output on a GDN hybrid, 20 of 20): needs
#   --enable-hierarchical-cache on the hybrid copy model and no LMCache; the suite's SGLang
#   launch does not make that configuration yet: not reachable here (docs/engines.md).
# No estimate from a run: SGLang's start on the H200 is unmeasured; the lane gets 1,200 s.
compile 0.5.6
VA='--sharedkv-service-sizes 3k --sharedkv-require-gpu'
# shellcheck disable=SC2086
sglang_lane sgl-mixed 1200 0.5.6 -m service_regression --sharedkv-allocators mixed $VA
