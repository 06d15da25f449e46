#!/usr/bin/env bash
# Session 41, call 1: the wgmma GEMM in clusters of 2 CTAs sharing x (M3_GEMM_TC_CLUSTER=2: row tiles
# mt, mt + 1 of a token tile, each multicasting half of every stage's x into both) against one CTA:
# the ragged checks with clusters, the dense shapes against their references and timed both ways, the
# 8-layer prefill both ways (and with the norms in clusters of 2, M3_NORM_CLUSTER=2); then session
# 40's unrun check, gpu.sh section 1 at HEAD (df08ea5's exact power-of-two merges, k_attn_f32<RB>),
# and with time left the MoE bench and a memcheck. END: the seconds it has (default 430).
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; this file copied into .gpu_pack):
#   END=430 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
CS="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer | head -1) --tool memcheck --error-exitcode 99 --print-limit 20"
{
M3_GEMM_TC_CLUSTER=2 timeout 60 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged cluster rc $?"; grep -cE "FAIL" $W/gr.log; tail -2 $W/gr.log
M3_GEMM_TC_CLUSTER=2 timeout 60 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged cluster rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
for c in 1 2; do
  echo "== [$SECONDS] bench_cuda_gemm 12288 6144, M3_GEMM_TC_CLUSTER=$c"
  M3_GEMM_TC_CLUSTER=$c timeout 60 $B/bench_cuda_gemm 12288 6144 2>&1 | grep -vE "^device"
done
for c in 1 2 n2; do
  v="M3_GEMM_TC_CLUSTER=$c"; [ $c = n2 ] && v="M3_NORM_CLUSTER=2"
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 2 --prefill 4096 --profile > $W/p$c.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill" -A3 $W/p$c.log | cut -c1-300
done
cp $W/p1.log $W/p2.log $W/pn2.log $OUT/ 2>/dev/null
END=${END:-430}; left=$((END - SECONDS))
M3_GPU_SECTIONS="1" timeout $left scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 (limit $left s) rc $?"; grep -E "FAILED|checks failed" $OUT/s1.log | head -20
if [ $SECONDS -lt $((END - 130)) ]; then for c in 1 2; do
  echo "== [$SECONDS] bench_cuda_moe, M3_GEMM_TC_CLUSTER=$c"
  M3_GEMM_TC_CLUSTER=$c timeout 80 $B/bench_cuda_moe 2>&1 | grep -vE "^device"
done; fi
[ $SECONDS -lt $((END - 10)) ] && { M3_GEMM_TC_CLUSTER=2 timeout 50 $CS $B/bench_cuda_gemm --ragged > $W/cs.log 2>&1; echo "[$SECONDS] memcheck gemm ragged cluster rc $?"; grep -E "ERROR SUMMARY" $W/cs.log; }
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call1.log
