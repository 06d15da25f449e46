#!/usr/bin/env bash
# session 38 call 2: token tiles of 192 in the wgmma GEMM (M3_GEMM_TC_BN=192, MXFP8 / NVFP4 above 128
# tokens) and the MoE's fat last tiles (M3_MOE_TC_FAT=1: an expert's last 128 + 64 rows one tile of
# 192, not a full tile and a 64-row tail), checked (ragged shapes in full) and timed against the defaults.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
{
M3_GEMM_TC_BN=192 timeout 60 $B/bench_cuda_gemm --ragged > /tmp/rag.log 2>&1; echo "[$SECONDS] ragged BN192 rc $?"; grep -E "FAIL|passed" /tmp/rag.log | head -5
for shp in "12288 6144" "6144 3072" "8192 6144"; do
  for v in 128 192; do
    echo "== bench_cuda_gemm $shp, M3_GEMM_TC_BN=$v"
    M3_GEMM_TC_BN=$v timeout 90 $B/bench_cuda_gemm $shp 2>&1 | grep -vE "^device" | grep -E "MXFP8|NVFP4|FAIL|passed"
  done
done
echo "[$SECONDS] gemm done"
for v in "M3_MOE_TC_FAT=0" "M3_MOE_TC_FAT=1" "M3_MOE_TC_FAT=1 M3_GEMM_TC_BN=192"; do
  echo "== bench_cuda_moe, $v"
  env $v timeout 150 $B/bench_cuda_moe > /tmp/moe.log 2>&1; echo "rc $?"
  grep -E "FAIL|passed|^ *(128|130|200|256|512|2048|4096) " /tmp/moe.log | tail -12
  cp /tmp/moe.log "$OUT/moe-$(echo $v | tr ' =' '_-').log"
  echo "[$SECONDS]"
done
} 2>&1 | tee $OUT/call2.log
left=$((570 - SECONDS))
for v in "M3_MOE_TC_FAT=0" "M3_MOE_TC_FAT=1 M3_GEMM_TC_BN=192"; do
  [ $left -gt 75 ] || break
  echo "== m3 bench 5 layers prefill 4096, $v"
  env $v timeout $left $B/m3 bench --random-weights --config $S --layers 5 --batch 1 --context 4096 --steps 2 --prefill 4096 --profile 2>&1 | grep -E "^prefill|per op" -A1 | grep -vE "^--" | tail -3 | cut -c1-300
  left=$((570 - SECONDS))
done 2>&1 | tee -a $OUT/call2.log
