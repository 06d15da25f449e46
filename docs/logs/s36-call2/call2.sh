#!/usr/bin/env bash
# session 36 call 2 (no H200 came: the card lent): an A/B of the GEMV's item order:
# M3_GV_TILEFAST=1 numbers items tile first, so a CTA's 8 warps take 8 tiles of one K slice and share
# x in L1 (call 1's ncu of the 8-token grouped NVFP4 MoE GEMV: L1 hit 52%, L2 throughput above DRAM's);
# only where K slices are summed through global memory (M3_GV_CTARED=0 here, to compare).
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in): bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz 
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/ab; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
# the item order changes no bit: logits at the M3.1-Flash shapes (2 layers), steps of 3 and 8 tokens + decodes
python3 scripts/cut-layers.py $S 2 $W/two.json && $B/m3 make-tiny --out $W/two --config $W/two.json --quant mxfp8-nvfp4 --seed 5 > /dev/null 2>&1
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*7919)%32768}')
for u in 3 8; do
  for v in 0 1; do
    M3_GV_CTARED=0 M3_GV_TILEFAST=$v timeout 60 $B/m3 logits -m $W/two --ids "$ids" --ubatch $u --decode 4 --backend cuda -o $W/tf-u$u-$v.st > /dev/null 2>&1 || echo "FAILED: logits tf $v u $u"
  done
  $B/logits_diff $W/tf-u$u-1.st $W/tf-u$u-0.st --tol 1e-9 2>&1 | tail -1 | sed "s/^/ubatch $u tile-first vs slice-first: /"
done
echo "[$SECONDS] bit checks done"
for r in 1 2; do
  for e in "M3_GV_CTARED=1 M3_GV_TILEFAST=0" "M3_GV_CTARED=0 M3_GV_TILEFAST=0" "M3_GV_CTARED=0 M3_GV_TILEFAST=1" "M3_GV_CTARED=1 M3_GV_TILEFAST=1"; do
    f=$OUT/ab-$(echo $e | tr ' =' '_-')-r$r.log
    env $e timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $f 2>&1
    echo "$e r$r: $(grep -E '^(1|8) ' $f | awk '{print "b"$1" "$3}' | tr '\n' ' ') verify: $(grep -o 'verify pass of 8 tokens per sequence: [0-9.]* ms' $f | awk '{print $7}' | tr '\n' ' ')"
  done
done
echo "[$SECONDS] A/B done"
