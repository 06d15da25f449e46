#!/usr/bin/env bash
# Session 46, the short form of call1.sh for a small device budget: the wgmma prefill attention
# (M3_ATTN_WG=1) against the CPU (cases 6-8), the 8-layer 4096-token prefill with it and with the
# token tiles, then (time left) the tiles' cases and a memcheck.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack): END=240 bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-240}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
attn() { # env, case
  env $1 M3_BENCH_CASE=$2 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=${REPS:-5} timeout 40 $B/bench_cuda_attn $S > $W/a.log 2>&1
  echo "[$SECONDS] attn case $2 [$1] rc $?"; grep -E "^bf16|FAIL|passed|rror" $W/a.log | head -4
}
pre() {
  env $1 timeout 70 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 1 --prefill 4096 --profile > $W/p.log 2>&1
  echo "[$SECONDS] prefill 8 layers [$1] rc $?"; grep -E "prefill:|GPU time, 1 steps" $W/p.log | cut -c1-300
}
{
for k in 6 7 8; do attn M3_ATTN_WG=1 $k; done
[ $(left) -gt 70 ] && pre M3_ATTN_WG=1
[ $(left) -gt 70 ] && pre M3_ATTN_WG=0
for k in 6 7 8; do [ $(left) -gt 25 ] && attn M3_ATTN_WG=0 $k; done
for k in 6 7 8; do [ $(left) -gt 25 ] && attn "M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1" $k; done
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call2.log
