#!/usr/bin/env bash
# session 37 call 4: the fused MoE launch with static item order and a cooperative launch (call 3's
# tickets cost a same-address atomic per item: 147 us for the batch-1 MoE against 105 us in three
# launches). Bit-equality with M3_MOE_FUSE=0, 8-layer timings both ways (two rounds), ncu's
# per-kernel durations of batch-1 decode steps with the fused launch, the 16/30-layer dspark bench.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call4.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
{
python3 scripts/cut-layers.py $S 2 $W/x2.json && $B/m3 make-tiny --out $W/x2 --config $W/x2.json --quant mxfp8-nvfp4 --seed 5 >/dev/null
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')
for u in 1 3 8; do
  for f in 1 0; do
    M3_MOE_FUSE=$f timeout 120 $B/m3 logits -m $W/x2 --ids "$ids" --ubatch $u --decode 4 --backend cuda -o $W/f-u$u-f$f.st > $W/f-u$u-f$f.log 2>&1 || { echo "FAILED logits u$u f$f"; tail -3 $W/f-u$u-f$f.log; }
  done
  $B/logits_diff $W/f-u$u-f1.st $W/f-u$u-f0.st --tol 1e-9 | tail -3
done
echo "[$SECONDS] fuse equality done"
for r in 1 2; do
  for f in 1 0; do
    M3_MOE_FUSE=$f timeout 150 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $W/b8-f$f-r$r.log 2>&1
    echo "[$SECONDS] 8 layers fuse $f round $r rc $?"
    grep -E "verify pass of 8|^(1|8) +8192" $W/b8-f$f-r$r.log | cut -c1-160
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
M3_MOE_FUSE=1 timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $B/m3 bench --random-weights --config $S --layers 5 --batch 1,8 --context 8192 --steps 2 --prefill 0 > $W/ncu-f1.csv 2> $W/ncu-f1.err
echo "[$SECONDS] ncu rc $?"
grep -E "k_gemv_mma<4|route|swiglu_split|group_by" $W/ncu-f1.csv | tail -16 | awk -F'","' '{print $5, $(NF)}' | cut -c1-120
L=16; [ "${gmem:-0}" -ge 120000 ] && L=30
left=$((400 - SECONDS))
[ $left -gt 60 ] && timeout $left $B/m3 bench --random-weights --config $S --layers $L --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config $D > $W/bench$L-dspark.log 2>&1
echo "[$SECONDS] bench $L layers dspark rc $?"
grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $W/bench$L-dspark.log | cut -c1-230
} 2>&1 | tee $OUT/run.log
xz -c $W/ncu-f1.csv > $OUT/ncu-f1.csv.xz; cat $W/b8-f1-r1.log > $OUT/b8-f1-r1.log
