#!/usr/bin/env bash
# Session 47, call 2: bf16 chunks by bulk tensor copies (M3_ATTN_WG_TMA=1) against cp.async; the FP8 /
# NVFP4 producers with all pieces in flight (M3_ATTN_WG_PB=8) against half (the default); gpu.sh section 1 with the wgmma attention the default; ncu of k_attn_wg (case 7,
# bf16 and FP8); on an H200 issue 27's 30-layer dspark bench.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs moved aside): END=560 bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-560}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
tmabad=0 # a failed TMA check: section 1 runs without it
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
attn() { # env, case, kv
  env $1 M3_BENCH_CASE=$2 M3_BENCH_KV=${3:-bf16} M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=${REPS:-5} timeout 60 $B/bench_cuda_attn $S > $W/a.log 2>&1
  local rc=$?; case "$1" in *TMA=1*) { [ $rc -ne 0 ] || grep -q FAIL $W/a.log; } && tmabad=1;; esac
  echo "[$SECONDS] attn case $2 kv ${3:-bf16} [$1] rc $rc"; grep -E "^(bf16|fp8|nvfp4) |FAIL|passed|rror" $W/a.log | head -4
}
pre() { # env, kv
  env $1 timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 1 --prefill 4096 --kv-cache-dtype ${2:-bf16} --profile > $W/p.log 2>&1
  echo "[$SECONDS] prefill 8 layers kv ${2:-bf16} [$1] rc $?"; grep -E "prefill:|GPU time, 1 steps" $W/p.log | cut -c1-300
}
{
for k in 6 7 8; do for v in 0 1; do attn M3_ATTN_WG_TMA=$v $k; done; done
for kv in fp8 nvfp4; do for k in 6 7; do for pb in 4 8; do attn M3_ATTN_WG_PB=$pb $k $kv; done; done; done
for v in 0 1; do pre M3_ATTN_WG_TMA=$v bf16; done
for pb in 4 8; do pre M3_ATTN_WG_PB=$pb fp8; done
M3_ATTN_WG_TMA=1 M3_BENCH_CASE=7 M3_BENCH_KV=bf16 M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 120 compute-sanitizer --tool memcheck $B/bench_cuda_attn $S > $W/mc.log 2>&1
echo "[$SECONDS] memcheck TMA case 7 rc $?"; grep -E "ERROR SUMMARY|passed|FAIL" $W/mc.log | head -3
echo "section 1 with M3_ATTN_WG_TMA=$((1 - tmabad))"
} > $OUT/call2.log 2>&1 # (not a pipe: tmabad is read below)
cat $OUT/call2.log
M3_ATTN_WG_TMA=$((1 - tmabad)) M3_GPU_SECTIONS=1 timeout $(( $(left) > 330 ? 300 : $(left) - 30 )) scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?" | tee -a $OUT/call2.log; grep -E "FAILED|checks failed" $OUT/s1.log | head -20 | tee -a $OUT/call2.log
{
for kv in bf16 fp8; do
  [ $(left) -gt 60 ] || break
  M3_ATTN_WG_TMA=$((1 - tmabad)) M3_BENCH_CASE=7 M3_BENCH_KV=$kv M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout $(( $(left) - 20 )) ncu --kernel-name-base demangled -k "regex:k_attn_wg" \
    --launch-count 1 --set full -o $W/wg-$kv $B/bench_cuda_attn $S > $W/ncu-$kv.log 2>&1; echo "[$SECONDS] ncu $kv rc $?"; tail -2 $W/ncu-$kv.log
  ncu -i $W/wg-$kv.ncu-rep --page details > $OUT/ncu-wg-$kv.txt 2>&1
  ncu -i $W/wg-$kv.ncu-rep --page source --csv --print-source=sass > $W/sass-$kv.csv 2>&1 && xz -9 -c $W/sass-$kv.csv > $OUT/ncu-wg-sass-$kv.csv.xz
done
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 160 ]; then
  timeout 150 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"; grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
echo "[$SECONDS] done"
} 2>&1 | tee -a $OUT/call2.log
