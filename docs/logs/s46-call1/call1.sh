#!/usr/bin/env bash
# Session 46, call 1: the wgmma prefill attention (attention_wg.cu) against the CPU and against the
# token tiles (M3_ATTN_WG=0, the default while unchecked), then the 8-layer 4096-token prefill with each.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack): END=560 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-560}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
{
# correctness first: cases 6-8 at precision bf16, bf16 cache (wgmma), M3.1-Flash shapes, then D 64 (m3-mqa-q)
M3_ATTN_WG=1 M3_BENCH_CASE=6 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 60 $B/bench_cuda_attn $S > $W/a.log 2>&1
if [ $? -ne 0 ]; then grep -E "^bf16|FAIL" $W/a.log | head -3; echo "default failed: V's descriptor swapped"
  M3_ATTN_WG=1 M3_ATTN_WG_VSWAP=1 M3_BENCH_CASE=6 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 60 $B/bench_cuda_attn $S 2>&1 | grep -E "^bf16|FAIL|passed" | head -3
fi
for v in "M3_ATTN_WG=1" "M3_ATTN_WG=1 M3_ATTN_WG_NC=1" "M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1" "M3_ATTN_WG=0"; do
  for k in 6 7 8; do
    env $v M3_BENCH_CASE=$k M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=20 timeout 60 $B/bench_cuda_attn $S > $W/a.log 2>&1
    echo "[$SECONDS] attn case $k [$v] rc $?"; grep -E "^bf16|FAIL|passed|rror" $W/a.log | head -4
  done
done
for k in 6 7 8; do
  M3_ATTN_WG=1 M3_ATTN_TILE=1 M3_BENCH_CASE=$k M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 60 $B/bench_cuda_attn tests/data/m3-mqa-q/config.json > $W/m.log 2>&1
  echo "[$SECONDS] mqa case $k rc $?"; grep -E "^bf16|FAIL|passed|rror" $W/m.log | head -4
done
M3_ATTN_WG=1 M3_BENCH_CASE=8 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 120 compute-sanitizer --tool memcheck $B/bench_cuda_attn $S > $W/mc.log 2>&1
echo "[$SECONDS] memcheck case 8 rc $?"; grep -E "ERROR SUMMARY|passed|FAIL" $W/mc.log | head -3
M3_ATTN_WG=1 M3_BENCH_CASE=7 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 120 compute-sanitizer --tool racecheck $B/bench_cuda_attn $S > $W/rc.log 2>&1
echo "[$SECONDS] racecheck case 7 rc $?"; grep -E "ERROR SUMMARY|hazard|passed|FAIL" $W/rc.log | head -5
cp $W/mc.log $W/rc.log $OUT/ 2>/dev/null
for v in "M3_ATTN_WG=1" "M3_ATTN_WG=0" "M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1" "M3_ATTN_WG=1" "M3_ATTN_WG=0" "M3_ATTN_WG=1 M3_ATTN_WG_NC=1"; do
  [ $(left) -gt 60 ] || break
  env $v timeout 100 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 3 --prefill 4096 --profile > $W/p.log 2>&1
  echo "[$SECONDS] prefill 8 layers [$v] rc $?"; grep -E "prefill:|GPU time, 1 steps" $W/p.log | cut -c1-300
done
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call1.log
