#!/usr/bin/env bash
# Session 41, call 1: the wgmma GEMM in clusters of 2 CTAs sharing x (M3_GEMM_TC_CLUSTER=2: row tiles
# mt, mt + 1 of a token tile, each multicasting half of every stage's x into both) against one CTA:
# the ragged checks (and memcheck) with clusters, the dense shapes and the MoE op against their
# references and timed both ways, the 8-layer prefill both ways; then ncu (SpeedOfLight, memory
# workload, warp states) of the first 36 k_gemm_tc launches of a 4096-token prefill at 4 layers.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; this file copied into .gpu_pack): bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
CS="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer | head -1) --tool memcheck --error-exitcode 99 --print-limit 20"
{
M3_GEMM_TC_CLUSTER=2 timeout 60 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged cluster rc $?"; grep -cE "FAIL" $W/gr.log; tail -2 $W/gr.log
M3_GEMM_TC_CLUSTER=2 timeout 60 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged cluster rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
M3_GEMM_TC_CLUSTER=2 timeout 90 $CS $B/bench_cuda_gemm --ragged > $W/cs.log 2>&1; echo "[$SECONDS] memcheck gemm ragged cluster rc $?"; grep -E "ERROR SUMMARY" $W/cs.log
for shp in "12288 6144" "6144 3072"; do for c in 1 2; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, M3_GEMM_TC_CLUSTER=$c"
  M3_GEMM_TC_CLUSTER=$c timeout 90 $B/bench_cuda_gemm $shp 2>&1 | grep -vE "^device"
done; done
for c in 1 2; do
  echo "== [$SECONDS] bench_cuda_moe, M3_GEMM_TC_CLUSTER=$c"
  M3_GEMM_TC_CLUSTER=$c timeout 150 $B/bench_cuda_moe 2>&1 | grep -vE "^device"
done
for c in 1 2; do
  M3_GEMM_TC_CLUSTER=$c timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 2 --prefill 4096 --profile > $W/p$c.log 2>&1
  echo "== [$SECONDS] 8 layers, M3_GEMM_TC_CLUSTER=$c rc $?"; grep -E "^prefill" -A3 $W/p$c.log | cut -c1-300
done
cp $W/p1.log $W/p2.log $OUT/ 2>/dev/null
} 2>&1 | tee $OUT/call1.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
left=$((585 - SECONDS)); [ $left -gt 150 ] && left=150
timeout $left $NCU --kernel-name regex:k_gemm_tc --launch-count 36 --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section LaunchStats \
  $B/m3 bench --random-weights --config $S --layers 4 --batch 1 --context 4096 --steps 1 --prefill 4096 > $OUT/ncu-gemm.txt 2>&1
echo "[$SECONDS] ncu rc $?" | tee -a $OUT/call1.log
