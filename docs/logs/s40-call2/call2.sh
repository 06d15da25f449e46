#!/usr/bin/env bash
# Session 40, call 2: the attention's chunk step with q and P as one bf16 part (M3_ATTN_PARTS=1) against
# three (f32 precision): bench_cuda_attn times (its checks against the f32 CPU reference fail by design
# at 1 part: only the times are read), and m3 bench's 8-layer 4096-token prefill, per op, bf16 / FP8 KV.
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
{
for kv in bf16 fp8 nvfp4; do for np in 3 1; do
  M3_ATTN_PARTS=$np M3_BENCH_KV=$kv timeout 60 $B/bench_cuda_attn 2>&1 | grep -E "^$kv " | sed "s/^/parts $np: /" | cut -c1-160
  echo "[$SECONDS]"
done; done
for kv in bf16 fp8; do for np in 3 1; do
  M3_ATTN_PARTS=$np timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --kv-cache-dtype $kv --profile > $W/p.log 2>&1
  echo "== [$SECONDS] 8 layers $kv KV, parts $np rc $?"; grep -E "^(1|8) +8192|^prefill" -A2 $W/p.log | grep -v "^--" | cut -c1-300
done; done
} 2>&1 | tee $OUT/call2.log
