#!/usr/bin/env bash
# Session 46, call 1: the wgmma prefill attention (attention_wg.cu, M3_ATTN_WG=1) against the CPU
# and against the token tiles (the default while it is unchecked), then the 8-layer 4096-token
# prefill with each; its variants (PIPE: P V overlapped with the next softmax; NC=1: 4 tokens a CTA).
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack): END=560 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-560}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
attn() { # env, case, config
  env $1 M3_BENCH_CASE=$2 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=${REPS:-20} timeout 60 $B/bench_cuda_attn ${3:-$S} > $W/a.log 2>&1
  echo "[$SECONDS] attn case $2 [$1] ${3:-} rc $?"; grep -E "^bf16|FAIL|passed|rror" $W/a.log | head -4
}
pre() {
  env $1 timeout 100 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 3 --prefill 4096 --profile > $W/p.log 2>&1
  echo "[$SECONDS] prefill 8 layers [$1] rc $?"; grep -E "prefill:|GPU time, 1 steps" $W/p.log | cut -c1-300
}
{
REPS=1 attn M3_ATTN_WG=1 6
if grep -q FAIL $W/a.log; then echo "V's descriptor swapped:"; REPS=1 attn "M3_ATTN_WG=1 M3_ATTN_WG_VSWAP=1" 6; fi
for k in 7 8; do attn M3_ATTN_WG=1 $k; done
for k in 6 7 8; do attn M3_ATTN_WG=0 $k; done
pre M3_ATTN_WG=1; pre M3_ATTN_WG=0
for k in 6 7 8; do attn "M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1" $k; done
pre "M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1"
M3_ATTN_WG=1 M3_BENCH_CASE=8 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 120 compute-sanitizer --tool memcheck $B/bench_cuda_attn $S > $W/mc.log 2>&1
echo "[$SECONDS] memcheck case 8 rc $?"; grep -E "ERROR SUMMARY|passed|FAIL" $W/mc.log | head -3
[ $(left) -gt 150 ] && { M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1 M3_BENCH_CASE=7 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 120 compute-sanitizer --tool memcheck $B/bench_cuda_attn $S > $W/mc2.log 2>&1
  echo "[$SECONDS] memcheck PIPE case 7 rc $?"; grep -E "ERROR SUMMARY|passed|FAIL" $W/mc2.log | head -3; }
for k in 6 7 8; do [ $(left) -gt 40 ] && REPS=1 attn "M3_ATTN_WG=1 M3_ATTN_TILE=1" $k tests/data/m3-mqa-q/config.json; done
[ $(left) -gt 60 ] && pre "M3_ATTN_WG=1 M3_ATTN_WG_NC=1"
[ $(left) -gt 60 ] && pre M3_ATTN_WG=1
[ $(left) -gt 60 ] && pre M3_ATTN_WG=0
for k in 6 7 8; do [ $(left) -gt 30 ] && attn "M3_ATTN_WG=1 M3_ATTN_WG_NC=1" $k; done
cp $W/mc.log $W/mc2.log $OUT/ 2>/dev/null
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call1.log
