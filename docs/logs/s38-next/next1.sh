#!/usr/bin/env bash
# For the next GPU session (written in session 38, whose device time was spent): the checks that
# 8a94fc6 added and never ran - bench_cuda_moe --ragged with BF16 experts (fat tiles off for them),
# bench_cuda_gemm --ragged with T = 200 / 300 at forced 192-token tiles, both under memcheck too -
# then gpu.sh section 1, and on an H200 the 30-layer figures: m3 bench --dspark-config (issue 27)
# and the 4096-token prefill (192-token tiles, fat MoE tiles) against the old tiles.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/next1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
{
timeout 90 $B/bench_cuda_moe --ragged > $OUT/moe-ragged.log 2>&1; echo "[$SECONDS] moe ragged rc $?"; grep -E "FAIL|passed|experts" $OUT/moe-ragged.log | head
M3_MOE_TC_FAT=0 timeout 90 $B/bench_cuda_moe --ragged > /tmp/m0.log 2>&1; echo "[$SECONDS] moe ragged FAT=0 rc $?"; tail -1 /tmp/m0.log
timeout 150 $CS --tool memcheck --error-exitcode 9 $B/bench_cuda_moe --ragged > /tmp/cm.log 2>&1; echo "[$SECONDS] memcheck moe ragged rc $?"; tail -2 /tmp/cm.log
M3_GEMM_TC_BN=192 timeout 60 $B/bench_cuda_gemm --ragged > $OUT/gemm-ragged192.log 2>&1; echo "[$SECONDS] gemm ragged 192 rc $?"; tail -1 $OUT/gemm-ragged192.log
M3_GEMM_TC_BN=192 timeout 150 $CS --tool memcheck --error-exitcode 9 $B/bench_cuda_gemm --ragged > /tmp/cg.log 2>&1; echo "[$SECONDS] memcheck gemm ragged 192 rc $?"; tail -2 /tmp/cg.log
} 2>&1 | tee $OUT/next1.log
M3_GPU_SECTIONS=1 timeout 240 scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?" | tee -a $OUT/next1.log; grep -E "FAILED|checks failed" $OUT/s1.log | head | tee -a $OUT/next1.log
if [ "${gmem:-0}" -ge 120000 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?" | tee -a $OUT/next1.log
  grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230 | tee -a $OUT/next1.log
  for v in "M3_GEMM_TC_BN=0" "M3_GEMM_TC_BN=128 M3_MOE_TC_FAT=0"; do
    left=$((580 - SECONDS)); [ $left -gt 90 ] || break
    env $v timeout $left $B/m3 bench --random-weights --config $S --layers 30 --batch 1 --context 4096 --steps 2 --prefill 4096 --profile > /tmp/p.log 2>&1
    echo "== 30 layers prefill 4096, $v" | tee -a $OUT/next1.log; grep -E "^prefill|per op" -A1 /tmp/p.log | tail -3 | cut -c1-300 | tee -a $OUT/next1.log
  done
fi
