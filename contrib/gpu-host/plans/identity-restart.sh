# shellcheck shell=bash
# A service wave's plan, issue 50 item 4: a persistent L2 carried across a restart with a
# changed model configuration under the same name must never serve the old KV as a hit
# with wrong answers (vLLM #56311's condition through LMCache's L2).
#
# Runnable now on CPU: the stub's restart-server pair (an fs L2 carried across, RoPE
# scaling changed under the same name; the planted identity-blind fault fails it) and the
# real server's (restarted servers of chunk 256 and 512 read the fs L2).
# To build for the GPU: the hosts topology over --sharedkv-l2 fs (and a Redis the user
# names, restarted with its persistence on: the restart-l2 row), the pair stopped, then
# relaunched with --hf-overrides '{"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}'
# under the same --served-model-name; and vLLM 0.26's native offload file tier, where it
# has one (PR #56331 adds the configuration to its key).
lane identity-restart 600 0.5.6 -m identity -k restart --sharedkv-require-gpu
