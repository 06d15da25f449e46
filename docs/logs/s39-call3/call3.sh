#!/usr/bin/env bash
# Session 39, call 3 (not run: no device time left; the next session's first measurement): FP8 / NVFP4
# caches take tiles for every token of prefill-like steps - the 8-layer 4096-token prefill with FP8 and
# NVFP4 KV, per op: default, M3_ATTN_TILE_ALL=0 (tiles below topk blocks only), M3_ATTN_TILE=0 (split
# kernel); bench_cuda_attn's prefill cases at the default.
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call3.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
for kv in nvfp4 fp8; do for v in "M3_ATTN_TILE=-1" "M3_ATTN_TILE_ALL=0" "M3_ATTN_TILE=0"; do
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 4096 --steps 2 --prefill 4096 --kv-cache-dtype $kv --profile > $W/p.log 2>&1
  echo "== 8 layers $kv KV, $v rc $?" | tee -a $OUT/call3.log; grep -E "^prefill" -A2 $W/p.log | cut -c1-300 | tee -a $OUT/call3.log
done; done
for kv in nvfp4 fp8; do for k in 6 7 8; do M3_BENCH_CASE=$k M3_BENCH_KV=$kv timeout 30 $B/bench_cuda_attn 2>&1 | grep -E "^$kv |FAIL" | cut -c1-150 | tee -a $OUT/call3.log; done; done
