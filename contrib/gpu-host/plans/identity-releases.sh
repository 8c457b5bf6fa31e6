# shellcheck shell=bash
# A service wave's plan, issue 50 item 3: two LMCache releases sharing one L2, each
# direction a verdict (keys found and bytes exact / keys refused / wrong bytes served).
#
# Runnable now: the model-free cells (the real server and LMCache's own client, one fs L2)
# with 0.5.7rc2 installed beside 0.5.6 (`pip install --no-deps --target DIR
# lmcache==0.5.7rc2`: on CPU both directions found the keys with exact bytes,
# docs/runs/identity-release-cpu.json). On the GPU host they run with the KV on the GPU
# once the transfer driver takes --device cuda (to build: identity_transfer's driver
# passes its device to make_kv, as transfer_provider's roles do).
# To build for the served cells: the hosts topology (two MP servers over --sharedkv-l2 fs)
# with server 2 from the 0.5.7rc2 site (lmcache-site.sh layers a release over the base
# site), replica 2's connector from the same site; vLLM 0.26's LMCacheMPConnector imports
# only what 0.5.7rc2 kept (the in-process LMCacheConnectorV1 cannot: a usage error naming
# lmcache.v1.cache_engine -> lmcache.inprocess.v1.cache_engine), then `compare` across the
# two runs' reports.
lane identity-releases 600 0.5.6 -m identity -k lmcache-release \
  --sharedkv-identity-release-site "$SHAREDKV_SITES/site-lmcache-0.5.7rc2" \
  --sharedkv-require-gpu
