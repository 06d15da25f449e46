#!/usr/bin/env bash
# Session 40, call 5: compute-sanitizer memcheck of the precision-bf16 attention paths: the token tiles
# (bench_cuda_attn case 8, bf16 and NVFP4 caches), k_attn_f32_g16 at bf16 (one-token FP8 decode, case 0),
# and the tensor-core kernels on an f32 cache (a 300-token prompt, tiles for every token, then decodes).
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call5.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; D=tests/data
CS="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer | head -1) --tool memcheck --error-exitcode 99 --print-limit 20"
{
for kv in bf16 nvfp4; do M3_BENCH_PRECISION=bf16 M3_ATTN_TILE_ALL=1 M3_BENCH_CASE=8 M3_BENCH_KV=$kv M3_BENCH_REPS=1 timeout 120 $CS $B/bench_cuda_attn > /tmp/c.log 2>&1
  echo "[$SECONDS] memcheck tiles bf16 precision $kv rc $?"; grep -E "ERROR SUMMARY|FAIL|passed" /tmp/c.log | head -3; done
M3_BENCH_PRECISION=bf16 M3_BENCH_CASE=0 M3_BENCH_KV=fp8 M3_BENCH_REPS=1 timeout 100 $CS $B/bench_cuda_attn > /tmp/c.log 2>&1
echo "[$SECONDS] memcheck f32_g16 bf16 fp8 decode rc $?"; grep -E "ERROR SUMMARY|FAIL|passed" /tmp/c.log | head -3
M3_ATTN_TILE=1 M3_ATTN_TILE_ALL=1 timeout 100 $CS $B/m3 logits -m $D/m3-gqa3-q --ids "$(seq 1 300 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')" --decode 2 --kv-cache-dtype f32 --backend cuda -o /tmp/cs.st > /tmp/c.log 2>&1
echo "[$SECONDS] memcheck f32 cache tiles rc $?"; grep -E "ERROR SUMMARY" /tmp/c.log | head -3
} 2>&1 | tee $OUT/call5.log
