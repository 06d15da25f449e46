#!/usr/bin/env bash
# For the next GPU session (written in session 40, whose device time was spent): df08ea5 (the bf16
# attention's merges by exact powers of two, k_attn_f32<RB>) was compiled, never run. gpu.sh sections 1
# (references, with the tiles' bf16 teacher-forced checks) and 3 (bench_cuda_attn at both precisions),
# then session 40's call 5 memchecks (the bf16 tiles, k_attn_f32_g16<RB>, an f32 cache on the tensor
# cores) and the 8-layer prefill / decode at the default against M3_ATTN_PARTS=3.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; .gpu_pack with this file and
# docs/logs/s40-call5/call5.sh copied in): bash .gpu_pack/next1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/wn; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
M3_GPU_SECTIONS="1 3" timeout 420 scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s13.log 2>&1
echo "[$SECONDS] sections 1, 3 rc $?" | tee $OUT/next1.log; grep -E "FAILED|checks failed" $OUT/s13.log | head -20 | tee -a $OUT/next1.log
[ $SECONDS -lt 480 ] && OUT=$W bash .gpu_pack/call5.sh 2>&1 | tee -a $OUT/next1.log
# the tiles at one part: 8-token tiles (a third of the shared memory of session 39's) and verify passes
for k in 2 4 6 7 8; do for v in "M3_ATTN_TILE=-1" "M3_ATTN_TILE=1 M3_ATTN_TILE_ALL=1" "M3_ATTN_TILE=1 M3_ATTN_TILE_ALL=1 M3_ATTN_TILE_TOKENS=8"; do
  [ $SECONDS -lt 500 ] || break 2
  env $v M3_BENCH_PRECISION=bf16 M3_BENCH_CASE=$k M3_BENCH_KV=bf16 timeout 30 $B/bench_cuda_attn 2>&1 | grep -E "^bf16 |FAIL" | sed "s/^/$v: /" | cut -c1-170 | tee -a $OUT/next1.log
done; done
for v in "M3_ATTN_PARTS=0" "M3_ATTN_PARTS=3"; do
  [ $SECONDS -lt 560 ] || break
  env $v timeout 40 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --profile > $W/p.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?" | tee -a $OUT/next1.log; grep -E "^(1|8) +8192|^prefill" -A2 $W/p.log | grep -v "^--" | cut -c1-300 | tee -a $OUT/next1.log
done
