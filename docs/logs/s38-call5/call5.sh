#!/usr/bin/env bash
# session 38 call 5: the tensor-core attention with a warp's next chunk requested early (K after
# S, V after P V: M3_ATTN_PIPE, default on): bench_cuda_attn (every cache dtype, against the CPU)
# both ways, gpu.sh section 1, racecheck on a prefill, m3 bench at 5 layers (prefill 4096) both ways.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call5.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
{
for p in 1 0; do
  M3_ATTN_PIPE=$p M3_BENCH_REPS=30 timeout 120 $B/bench_cuda_attn > $OUT/attn-pipe$p.log 2>&1; echo "[$SECONDS] bench_cuda_attn M3_ATTN_PIPE=$p rc $?"
  grep -iE "FAIL|attention" $OUT/attn-pipe$p.log | head -30 | cut -c1-200
done
timeout 90 $CS --tool racecheck --error-exitcode 9 $B/m3 logits -m tests/data/m3-wide-q --ids "$(seq 1 300 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%500}')" --decode 2 --backend cuda -o /tmp/rc.st > /tmp/rc.log 2>&1
echo "[$SECONDS] racecheck prefill 300 rc $?"; tail -2 /tmp/rc.log
} 2>&1 | tee $OUT/call5.log
M3_GPU_SECTIONS=1 timeout 240 scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?" | tee -a $OUT/call5.log; grep -E "FAILED|checks failed" $OUT/s1.log | head -20 | cut -c1-240 | tee -a $OUT/call5.log
for p in 1 0; do
  left=$((575 - SECONDS)); [ $left -gt 60 ] || break
  echo "== m3 bench 5 layers prefill 4096, M3_ATTN_PIPE=$p" | tee -a $OUT/call5.log
  M3_ATTN_PIPE=$p timeout $left $B/m3 bench --random-weights --config $S --layers 5 --batch 1,8 --context 8192 --steps 5 --prefill 4096 --profile > /tmp/b.log 2>&1
  grep -E "^prefill|^ *(1|8) +8192|per op" -A1 /tmp/b.log | grep -vE "^--" | cut -c1-300 | tee -a $OUT/call5.log
done
