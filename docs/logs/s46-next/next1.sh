#!/usr/bin/env bash
# Session 46's next call: the wgmma prefill attention (attention_wg.cu, M3_ATTN_WG=1; off by default
# until this passes) against the CPU for each cache dtype, the 8-layer 4096-token prefill with it and
# with the token tiles (bf16, FP8 KV), its variants (PIPE: P V overlapped with the next softmax; NC=1:
# 4 tokens a CTA), memchecks; on an H200 also issue 27's 30-layer dspark bench.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs and tests/data/m3-wide-q* moved
# aside if the tree is over 64 MiB): END=540 bash .gpu_pack/next1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-540}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
CSB=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
hung=0 # a timed-out wgmma run (a barrier deadlock): its other runs are skipped
attn() { # env, case, kv
  env $1 M3_BENCH_CASE=$2 M3_BENCH_KV=${3:-bf16} M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=${REPS:-5} timeout 60 $B/bench_cuda_attn $S > $W/a.log 2>&1
  local rc=$?; [ $rc -eq 124 ] && hung=1
  echo "[$SECONDS] attn case $2 kv ${3:-bf16} [$1] rc $rc"; grep -E "^(bf16|fp8|nvfp4) |FAIL|passed|rror" $W/a.log | head -4
}
wg() { [ $hung -eq 0 ] && [ $(left) -gt ${1:-60} ]; }
pre() { # env, kv
  env $1 timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 1 --prefill 4096 --kv-cache-dtype ${2:-bf16} --profile > $W/p.log 2>&1
  local rc=$?; [ $rc -eq 124 ] && case "$1" in *WG=1*) hung=1;; esac
  echo "[$SECONDS] prefill 8 layers kv ${2:-bf16} [$1] rc $rc"; grep -E "prefill:|GPU time, 1 steps" $W/p.log | cut -c1-300
}
{
REPS=1 attn M3_ATTN_WG=1 6
if grep -q FAIL $W/a.log; then echo "V's descriptor swapped:"; REPS=1 attn "M3_ATTN_WG=1 M3_ATTN_WG_VSWAP=1" 6; fi
for k in 7 8; do wg && attn M3_ATTN_WG=1 $k; done
for kv in fp8 nvfp4; do for k in 6 7 8; do wg && attn M3_ATTN_WG=1 $k $kv; done; done
wg 100 && pre M3_ATTN_WG=1; pre M3_ATTN_WG=0
wg 100 && pre M3_ATTN_WG=1 fp8; [ $(left) -gt 100 ] && pre M3_ATTN_WG=0 fp8
for k in 6 7 8; do [ $(left) -gt 70 ] && attn M3_ATTN_WG=0 $k; done
for k in 6 7 8; do wg 70 && attn "M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1" $k; done
wg 100 && pre "M3_ATTN_WG=1 M3_ATTN_WG_PIPE=1"
for kv in bf16 nvfp4; do
  wg 130 || break
  M3_ATTN_WG=1 M3_BENCH_CASE=8 M3_BENCH_KV=$kv M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 120 $CSB --tool memcheck $B/bench_cuda_attn $S > $W/mc-$kv.log 2>&1
  echo "[$SECONDS] memcheck case 8 kv $kv rc $?"; grep -E "ERROR SUMMARY|passed|FAIL" $W/mc-$kv.log | head -3; cp $W/mc-$kv.log $OUT/
done
wg 100 && pre "M3_ATTN_WG=1 M3_ATTN_WG_NC=1"
for k in 6 7 8; do wg 70 && attn "M3_ATTN_WG=1 M3_ATTN_WG_NC=1" $k; done
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 160 ]; then
  timeout 150 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"; grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/next1.log
