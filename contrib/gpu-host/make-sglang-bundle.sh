#!/bin/bash
# (See README.md beside this file, "SGLang".) Build what the offline GPU host needs to run
# SGLang 0.5.17 (the newest SGLang that pins the host's torch 2.11.0) beside the staged
# vLLM and LMCache 0.5.6, as parts that each travel with the repository in one 64 MiB
# transfer. Output (default .stage/ in the repo root; git-ignored):
#   sglang.tar.xz.part-00..NN - one xz tar stream of site/ (SGLang 0.5.17, sgl_kernel 0.4.5
#                               cut to sm_90 without its FA3 library) and wheels/ (what
#                               SGLang pins that vLLM 0.26.0's bundle does not bring), cut
#                               into 40 MiB parts
#   sglang.sha256             - every part's sha256: sglang-site.sh joins and unpacks only
#                               when every part is there and matches
# Measured 2026-12-07 (pip download on this side; not yet run on the host): sglang 0.5.17
# is a cp312 manylinux_2_34 wheel (glibc >= 2.34 on the host), 22.3 MB; sglang-kernel
# 0.4.5 is 383 MB, of which sgl_kernel/flash_ops.abi3.so (FA3, 1.12 GB unpacked, 342 MB
# deflated) does not travel: the suite launches SGLang with --attention-backend triton.
set -euo pipefail
OUT=${1:-.stage}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
P=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
   --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64
   --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pip download -q --no-deps "${P[@]}" -d "$W/whl" sglang==0.5.17 sglang-kernel==0.4.5
mkdir -p "$W/b/site" "$W/b/wheels"
for wheel in "$W"/whl/*.whl; do (cd "$W/b/site" && unzip -q -o "$wheel"); done
K="$W/b/site/sgl_kernel"
# FA3 (imported only by sgl_kernel.flash_attn), Blackwell's ops, FlashMLA and InfLLM: none
# is loaded on Hopper with triton attention and a dense model
rm -f "$K/flash_ops.abi3.so" "$K/flashmla_ops.abi3.so" "$K"/infllm_ops*.so
rm -rf "$K/sm100"
# SGLang 0.5.17's pins (its METADATA) that differ from vLLM 0.26.0's or that vLLM lacks
pip download -q --no-deps "${P[@]}" -d "$W/b/wheels" \
  flashinfer-python==0.6.15.post1 tilelang==0.1.11 z3-solver==4.15.4.0 apache-tvm-ffi==0.1.11 \
  transformers==5.12.1 xgrammar==0.2.1 numba==0.65.1 openai==2.6.1 openai-harmony==0.0.4 \
  outlines==0.1.11 torchao==0.17.0 timm==1.0.16 sgl-deep-gemm==0.1.5.post1 flash-attn-4 \
  helion==1.4 kernels==0.14.1 torch-memory-saver smg-grpc-servicer blobfile==3.0.0 \
  soundfile==0.13.1 nvidia-mathdx==25.6.0 quack-kernels==0.6.4 torchcodec==0.11.1
# pinned alike by vLLM 0.26.0 (cutlass-dsl 4.6.0, humming-kernels, tokenspeed-mla,
# torchaudio): the image that runs vLLM is taken to have them; SGLANG_FULL=1 carries them
if [ "${SGLANG_FULL:-0}" = 1 ]; then
  pip download -q --no-deps "${P[@]}" -d "$W/b/wheels" nvidia-cutlass-dsl==4.6.0 \
    nvidia-cutlass-dsl-libs-base==4.6.0 nvidia-cutlass-dsl-libs-cu13==4.6.0 \
    humming-kernels==0.1.10 tokenspeed-mla==0.1.8 torchaudio==2.11.0 cuda-python \
    cuda-bindings cuda-core nvidia-cudnn-frontend nccl4py cuda-tile
fi
du -sh "$W/b/site" "$W/b/wheels"
rm -f "$OUT"/sglang.tar.xz.part-*
(cd "$W/b" && tar -cf - site wheels | xz -6 -T2) | split -b 40M -d - "$OUT/sglang.tar.xz.part-"
(cd "$OUT" && sha256sum sglang.tar.xz.part-* > sglang.sha256)
ls -la "$OUT"/sglang.tar.xz.part-* "$OUT/sglang.sha256"
