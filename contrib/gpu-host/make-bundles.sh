#!/bin/bash
# (From ../shared/gpu-host; see README.md beside this file.) Build what an offline H200 host needs to run vLLM 0.26.0 + LMCache 0.5.6 (it has torch 2.11.0+cu130,
# Python 3.12, no network, and takes at most 64 MiB per transfer). Output (default: .stage/ in the repo root; git-ignore it):
#   vllm.tar.xz.part-00..02 - vLLM 0.26.0 (two xz tar streams, 112 MB) cut into 40 MiB parts:
#                         each leaves the repository's tracked files room within one
#                         64 MiB transfer; there, append each to /tmp/vllm.tar.xz and
#                         unpack it once (tar -xJif: -i reads past the first stream's end)
#   deps/               - wheels vLLM and LMCache import there that the image lacks (< 50 MiB)
# Seen working on an H200 on 2026-11-29: three transfers, then vLLM served a local Qwen3Next-family
# model and two replicas shared one LMCache MP server (see README.md beside this file).
set -euo pipefail
OUT=${1:-.stage}; mkdir -p "$OUT/deps"; OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
P=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_26_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pip download -q --no-deps "${P[@]}" -d "$W" vllm==0.26.0
mkdir -p "$W/site" && (cd "$W/site" && unzip -q "$W"/vllm-0.26.0-*.whl)
S="$W/site/vllm"
# parts not needed for FLASH_ATTN (FA3) on Hopper with a small model; keeps each part under the transfer limit
rm -rf "$S/vllm-rs" "$S/third_party/deep_gemm" "$S/third_party/fmha_sm100" "$S/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
       "$S/_flashmla_C.abi3.so" "$S/_flashmla_extension_C.abi3.so" "$S/_qutlass_C.abi3.so"
(cd "$W/site" && tar -cf - vllm/_C_stable_libtorch.abi3.so | xz -6 -T2 > "$OUT/a.tar.xz")
(cd "$W/site" && tar -cf - --exclude=vllm/_C_stable_libtorch.abi3.so vllm vllm-0.26.0.dist-info | xz -6 -T2 > "$OUT/b.tar.xz")
pip download -q --no-deps "${P[@]}" -d "$OUT/deps" \
  annotated-types==0.8.0 apache-tvm-ffi==0.1.10 cachetools==8.0.2 cbor2==6.3.0 compressed-tensors==0.17.0 \
  fastapi==0.136.3 httpx2==2.16.2 httpcore2==2.16.2 llguidance==1.7.6 loguru==0.7.3 msgspec==0.23.0 \
  openai==3.57.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 \
  pydantic-core==2.50.5 pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 typing-inspection==0.4.5 xgrammar==0.2.7 \
  uvicorn watchfiles model-hosting-container-standards jmespath aiofile caio blake3 \
  lmcache==0.5.6 nvtx opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions importlib_metadata zipp \
  cryptography cffi pycparser prometheus-fastapi-instrumentator opentelemetry-exporter-prometheus \
  syrupy redis  # the service tier's stored references: the image has pytest but not syrupy; LMCache's metrics (eviction counts) need the exporter
# redis (redis-py, py3-none-any, no dependencies on Python 3.12): the suite's client for the Redis it
# starts (in-process stack, resp/valkey L2), and LMCache's own requirement, which --no-deps skips
ls -la "$OUT"; du -sh "$OUT/deps"
cat "$OUT/a.tar.xz" "$OUT/b.tar.xz" | split -b 40M -d - "$OUT/vllm.tar.xz.part-" \
  && rm "$OUT/a.tar.xz" "$OUT/b.tar.xz"
ls -la "$OUT"/vllm.tar.xz.part-*
# LMCache in a folder of its own (lmcache-site.sh install 0.5.6 OUT/lmcache56): deps/, it and
# the repo together stay under one transfer's 64 MiB
mkdir -p "$OUT/lmcache56" && mv "$OUT"/deps/lmcache-0.5.6-*.whl "$OUT/lmcache56/"
# LMCache's source release cut to what lmcache-site.sh compile reads (csrc/, setup.py,
# setup_extensions/: about 150 KB) where the full one (9.4 MB) is at hand
SDIST=${LMCACHE_SDIST:-$(dirname "$0")/../../../shared/gpu-host/lmcache-0.5.6.tar.gz}
if [ -f "$SDIST" ]; then
  mkdir -p "$W/sdist" "$OUT/sdist"
  tar -xzf "$SDIST" -C "$W/sdist" lmcache-0.5.6/csrc lmcache-0.5.6/setup.py \
    lmcache-0.5.6/setup_extensions
  tar -czf "$OUT/sdist/lmcache-0.5.6.tar.gz" -C "$W/sdist" lmcache-0.5.6
fi
# redis-server and the libraries the GPU image lacks, for the L2 checks (redis-site.sh)
bash "$(dirname "$0")/redis-site.sh" stage "$OUT"
