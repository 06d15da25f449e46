#!/usr/bin/env bash
# Session 49, call 2 (prepared, not run): the f16 split no longer written past 256 rows (9d7e19a, 1b25630):
# its gain at a 4096-token prefill against the old behaviour ($M3_XSPLIT_ROWS=1000000), runs
# alternated; then gpu.sh section 1 (the references; wide-q's 600-token prefill crosses 256 rows);
# on an H200 first issue 27's 30-layer dspark bench; act_quant_check first (its misaligned-split refusal is new).
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs moved aside):
#   END=500 bash .gpu_pack/call2.sh   (section 1 gets what is left of END seconds)
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data; W=/tmp/w; mkdir -p $W
{
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 60 $B/act_quant_check > $W/aqc.log 2>&1; echo "[$SECONDS] act_quant_check rc $?"; grep -E "FAIL|passed|refused" $W/aqc.log | tail -4
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 150 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
    --dspark-config $D/m3.1-flash-dspark-shapes.json --profile > $OUT/bench30.log 2>&1
  echo "[$SECONDS] dspark 30 layers rc $?"; grep -E "^ *(1|8) +8192|verify|spec|draft|floor|projection" $OUT/bench30.log | cut -c1-240 | head -30
fi
for r in 1 2; do for rows in 256 1000000; do
  M3_XSPLIT_ROWS=$rows timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,64 --context 8192 --steps 5 --prefill 4096 --profile > $W/p.log 2>&1
  echo "[$SECONDS] run $r, split up to $rows rows: rc $?"; grep -E "prefill:|GPU time|^ *(1|64) +8192" $W/p.log | cut -c1-300
done; done
} 2>&1 | tee $OUT/call2.log
M3_GPU_SECTIONS=1 timeout $(( ${END:-500} - SECONDS )) scripts/gpu.sh $B /tmp/g1 > $OUT/s1.log 2>&1; echo "[$SECONDS] gpu.sh section 1 rc $?" | tee -a $OUT/call2.log
grep -E "FAIL|checks failed|^## " $OUT/s1.log | tail -12 | tee -a $OUT/call2.log
xz -9 $OUT/s1.log
