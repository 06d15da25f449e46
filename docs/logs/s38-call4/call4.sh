#!/usr/bin/env bash
# session 38 call 4, the tree to commit (192-token tiles where they save waves, fat MoE tiles by
# default): gpu.sh section 1; the GEMM / MoE checks of the new and old paths (ragged, in full);
# m3 bench at 8 layers (prefill 4096, decode batch 1 / 8) against the old tiles (M3_GEMM_TC_BN=128
# M3_MOE_TC_FAT=0), one binary.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call4.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
{
timeout 60 $B/bench_cuda_moe --ragged > /tmp/m1.log 2>&1; echo "[$SECONDS] moe ragged (fat) rc $?"; tail -1 /tmp/m1.log
M3_MOE_TC_FAT=0 timeout 60 $B/bench_cuda_moe --ragged > /tmp/m2.log 2>&1; echo "[$SECONDS] moe ragged FAT=0 rc $?"; tail -1 /tmp/m2.log
M3_GEMM_TC_BN=192 timeout 60 $B/bench_cuda_gemm --ragged > /tmp/g1.log 2>&1; echo "[$SECONDS] gemm ragged BN=192 rc $?"; tail -1 /tmp/g1.log
timeout 90 $B/bench_cuda_gemm 6144 3072 > $OUT/gemm-6144x3072.log 2>&1; echo "[$SECONDS] gemm 6144 3072 (default tiles) rc $?"; grep -E "fp|FAIL|passed" $OUT/gemm-6144x3072.log | cut -c1-90
} 2>&1 | tee $OUT/call4.log
M3_GPU_SECTIONS=1 timeout 240 scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?" | tee -a $OUT/call4.log; grep -E "FAILED|checks failed" $OUT/s1.log | head -20 | cut -c1-240 | tee -a $OUT/call4.log
for v in "M3_GEMM_TC_BN=0" "M3_GEMM_TC_BN=128 M3_MOE_TC_FAT=0"; do
  left=$((575 - SECONDS)); [ $left -gt 80 ] || break
  echo "== m3 bench 8 layers, $v" | tee -a $OUT/call4.log
  env $v timeout $left $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 5 --prefill 4096 --profile > /tmp/b.log 2>&1
  grep -E "^prefill|^ *(1|8) +8192|per op" -A1 /tmp/b.log | grep -vE "^--" | cut -c1-300 | tee -a $OUT/call4.log
done
