#!/usr/bin/env bash
# session 38 call 7: racecheck on a minimal stage ring of k_gemm_tc's pattern (pipe_race.cu: bulk
# copies on a full mbarrier, ld.shared reads, an empty mbarrier back), without and with a
# fence.proxy.async before the consumer's arrival; then k_gemm_tc itself both ways
# (M3_GEMM_TC_PFENCE=1: the fence), racecheck on its ragged cases and the time of a large GEMM.
# usage (after scripts/gpu-bin.sh and nvcc of pipe_race.cu into .gpu_pack; docs/logs moved aside):
#   bash .gpu_pack/call7.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
{
for f in 0 1; do
  timeout 60 $CS --tool racecheck --print-limit 4 .gpu_pack/pipe_race $f 2>&1 | grep -E "fence|Race|SUMMARY" | head -6
done
for f in 0 1; do
  M3_GEMM_TC_PFENCE=$f timeout 100 $CS --tool racecheck --print-limit 4 $B/bench_cuda_gemm --ragged > /tmp/r$f.log 2>&1
  echo "[$SECONDS] gemm ragged racecheck PFENCE=$f rc $?"; grep -E "SUMMARY|passed|FAIL" /tmp/r$f.log | head -3
done
for f in 0 1 0 1; do
  echo "== bench_cuda_gemm 8192 6144 PFENCE=$f"
  M3_GEMM_TC_PFENCE=$f timeout 60 $B/bench_cuda_gemm 8192 6144 2>&1 | grep -E "^(mxfp8|nvfp4|bf16) .* (1024|4096) |FAIL|passed" | cut -c1-80
done
} 2>&1 | tee $OUT/call7.log
