#!/usr/bin/env bash
# Session 39, call 2: the chunk step's S = Q K^T with an accumulator per part of q (12 MMA chains of
# D / 16, not 4 of 3 D / 16), and tiles only for the tokens that see every block on sparse layers -
# bench_cuda_attn (checks, times; split kernel and tiles for every token against the default on the
# prefill and 64 x 8 cases), m3 bench at 8 layers (decode 1 / 8, prefill 4096; the three),
# gpu.sh section 1 (with the tile checks).
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
L=${L:-480} # seconds this call may use
timeout 200 $B/bench_cuda_attn > $OUT/attn.log 2>&1; echo "[$SECONDS] bench_cuda_attn rc $?" | tee $OUT/call2.log
grep -E "FAIL|passed|^(bf16|fp8|nvfp4) " $OUT/attn.log | cut -c1-150 | tee -a $OUT/call2.log
for v in "M3_ATTN_TILE=-1" "M3_ATTN_TILE=0" "M3_ATTN_TILE_ALL=1"; do
  env $v timeout 100 $B/m3 bench --random-weights --config $S --layers 8 --batch $([ "$v" = M3_ATTN_TILE_ALL=1 ] && echo 1 || echo 1,8) --context 8192 --steps 5 --prefill 4096 --profile > $W/p.log 2>&1
  echo "== 8 layers, $v rc $?" | tee -a $OUT/call2.log; grep -E "^(1|8) +8192|^prefill" -A2 $W/p.log | grep -v "^--" | cut -c1-300 | tee -a $OUT/call2.log
done
M3_GPU_SECTIONS=1 timeout $((L - 120 - SECONDS)) scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?" | tee -a $OUT/call2.log; grep -E "FAILED|checks failed" $OUT/s1.log | head | tee -a $OUT/call2.log
{
for k in 4 7 6 8; do for kv in bf16 nvfp4; do
  [ $SECONDS -lt $((L - 15)) ] || break 2
  M3_ATTN_TILE=0 M3_BENCH_CASE=$k M3_BENCH_KV=$kv timeout 30 $B/bench_cuda_attn 2>&1 | grep -E "^$kv " | sed 's/^/split: /' | cut -c1-150
  M3_ATTN_TILE_ALL=1 M3_BENCH_CASE=$k M3_BENCH_KV=$kv timeout 30 $B/bench_cuda_attn 2>&1 | grep -E "^$kv " | sed 's/^/tiles: /' | cut -c1-150
done; done
echo "[$SECONDS] variants done"
} 2>&1 | tee -a $OUT/call2.log
