#!/usr/bin/env bash
# session 36 call 4: K slices of the grouped MoE GEMV. The launch sizes its work for one group per
# pick (64 at 8 tokens x top-8), the cost model then picks 1 K slice (whole-K items of 24 / 12 ring
# stages); ~50 experts are distinct under random routing, so 19,200 real items fall on 3,168
# resident warps: 7 rounds for 6.06 on average (the last run by 192 warps alone). M3_GV_MOEKS=N forces N slices.
# Then, on an H200, the 30-layer DSpark benchmark (issue 27) with the default and with MOEKS=4.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call4.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/ab; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
python3 scripts/cut-layers.py $S 2 $W/two.json && $B/m3 make-tiny --out $W/two --config $W/two.json --quant mxfp8-nvfp4 --seed 5 > /dev/null 2>&1
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*7919)%32768}')
for k in 0 4; do
  M3_GV_MOEKS=$k timeout 60 $B/m3 logits -m $W/two --ids "$ids" --ubatch 8 --decode 4 --backend cuda -o $W/ks$k.st > /dev/null 2>&1 || echo "FAILED: logits ks $k"
done
$B/logits_diff $W/ks4.st $W/ks0.st --tol 1e-4 2>&1 | tail -2 | sed "s/^/MOEKS 4 vs default: /"
for r in 1 2; do
  for k in 0 2 4 8; do
    f=$OUT/ab-ks$k-r$r.log
    M3_GV_MOEKS=$k timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $f 2>&1
    echo "MOEKS $k r$r: $(grep -E '^(1|8) ' $f | awk '{print "b"$1" "$3}' | tr '\n' ' ') verify: $(grep -o 'verify pass of 8 tokens per sequence: [0-9.]* ms' $f | awk '{print $8}' | tr '\n' ' ')"
  done
done
echo "[$SECONDS] A/B done"
L=16; [ "${gmem:-0}" -ge 120000 ] && L=30
for k in 0 4; do
  left=$((560 - SECONDS)); [ $left -gt 30 ] || break
  M3_GV_MOEKS=$k timeout $left $B/m3 bench --random-weights --config $S --layers $L --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config $D > $OUT/bench$L-ks$k.log 2>&1
  echo "[$SECONDS] bench $L layers MOEKS $k rc $?"
  grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $OUT/bench$L-ks$k.log | cut -c1-200
done
