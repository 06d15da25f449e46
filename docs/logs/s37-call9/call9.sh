#!/usr/bin/env bash
# session 37 call 9: the MoE router's x at 5-8 tokens staged (96 KB of shared memory) and rounded
# to bf16 as it lands (M3_ROUND_IN_LOAD=0: a rounding launch first): logits to the bit both ways
# (bf16, steps of 1, 4, 8 tokens), 8-layer timings both ways, then the 30-layer (H200) or
# 16-layer m3 bench --dspark-config at HEAD (issue 27).
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call9.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=16; [ "${gmem:-0}" -ge 120000 ] && L=30
{
timeout 200 $B/m3 bench --random-weights --config $S --layers $L --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config $D > $W/bench$L-dspark.log 2>&1
echo "[$SECONDS] bench $L layers dspark rc $?"
grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $W/bench$L-dspark.log | cut -c1-230
python3 scripts/cut-layers.py $S 2 $W/x2.json && $B/m3 make-tiny --out $W/x2 --config $W/x2.json --quant mxfp8-nvfp4 --seed 5 >/dev/null
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')
for u in 1 4 8; do
  for r in 1 0; do
    M3_ROUND_IN_LOAD=$r timeout 120 $B/m3 logits -m $W/x2 --ids "$ids" --ubatch $u --decode 4 --backend cuda --precision bf16 -o $W/r-u$u-r$r.st > $W/r.log 2>&1 || { echo "FAILED logits u$u r$r"; tail -3 $W/r.log; }
  done
  echo "x2 bf16 ubatch $u: $($B/logits_diff $W/r-u$u-r1.st $W/r-u$u-r0.st --tol 1e-9 | tail -3 | tr '\n' ' ')"
done
for rr in 1 2; do
  for v in 1 0; do
    M3_ROUND_IN_LOAD=$v timeout 150 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $W/b8.log 2>&1
    echo "[$SECONDS] 8 layers M3_ROUND_IN_LOAD=$v round $rr rc $?"
    grep -E "verify pass of 8|^(1|8) +8192" $W/b8.log | cut -c1-160
  done
done
} 2>&1 | tee $OUT/run.log
cp $W/bench$L-dspark.log $OUT/ 2>/dev/null
