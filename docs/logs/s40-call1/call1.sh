#!/usr/bin/env bash
# Session 40, call 1: session 39's call 3 (FP8 / NVFP4 KV prefill at 8 layers: default, M3_ATTN_TILE_ALL=0,
# the split kernel; bench_cuda_attn's prefill cases) and session 38's unrun checks (bench_cuda_moe --ragged
# with BF16 experts and FAT=0, bench_cuda_gemm --ragged at forced 192-token tiles, memcheck of both), then
# gpu.sh section 1 at this binary (the FP8 rule and piece_load were compiled, never run).
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w3; mkdir -p $W
L=${L:-580}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
{
timeout 90 $B/bench_cuda_moe --ragged > $W/moe-ragged.log 2>&1; echo "[$SECONDS] moe ragged rc $?"; grep -E "FAIL|passed|experts" $W/moe-ragged.log | head
M3_MOE_TC_FAT=0 timeout 90 $B/bench_cuda_moe --ragged > /tmp/m0.log 2>&1; echo "[$SECONDS] moe ragged FAT=0 rc $?"; tail -1 /tmp/m0.log
M3_GEMM_TC_BN=192 timeout 60 $B/bench_cuda_gemm --ragged > $W/gemm-ragged192.log 2>&1; echo "[$SECONDS] gemm ragged 192 rc $?"; tail -1 $W/gemm-ragged192.log
for kv in nvfp4 fp8; do for v in "M3_ATTN_TILE=-1" "M3_ATTN_TILE_ALL=0" "M3_ATTN_TILE=0"; do
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 4096 --steps 2 --prefill 4096 --kv-cache-dtype $kv --profile > $W/p.log 2>&1
  echo "== [$SECONDS] 8 layers $kv KV, $v rc $?"; grep -E "^prefill" -A2 $W/p.log | cut -c1-300
done; done
for kv in nvfp4 fp8; do for k in 6 7 8; do M3_BENCH_CASE=$k M3_BENCH_KV=$kv timeout 30 $B/bench_cuda_attn 2>&1 | grep -E "^$kv |FAIL" | cut -c1-150; done; done
timeout 150 $CS --tool memcheck --error-exitcode 9 $B/bench_cuda_moe --ragged > /tmp/cm.log 2>&1; echo "[$SECONDS] memcheck moe ragged rc $?"; tail -2 /tmp/cm.log
M3_GEMM_TC_BN=192 timeout 150 $CS --tool memcheck --error-exitcode 9 $B/bench_cuda_gemm --ragged > /tmp/cg.log 2>&1; echo "[$SECONDS] memcheck gemm ragged 192 rc $?"; tail -2 /tmp/cg.log
} 2>&1 | tee $OUT/call1.log
left=$((L - SECONDS)); if [ $left -gt 150 ]; then
M3_GPU_SECTIONS=1 timeout $left scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?" | tee -a $OUT/call1.log; grep -E "FAILED|checks failed" $OUT/s1.log | head | tee -a $OUT/call1.log
fi
