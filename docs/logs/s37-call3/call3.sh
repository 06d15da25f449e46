#!/usr/bin/env bash
# session 37 call 3: the fused MoE launch with its waits polling relaxed (backing off to 1 us, each
# counter in a line of its own) instead of acquiring every 64 ns: bit-equality with M3_MOE_FUSE=0
# again, racecheck both ways (where do call 2's 25 hazards come from), 8-layer timings both ways, and
# ncu's per-kernel durations (the GPU's own clock) of batch-1 decode steps at 5 layers, both ways.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call3.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
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
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
sids=$(seq 1 16 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')
for f in 1 0; do
  M3_MOE_FUSE=$f timeout 150 $CS --tool racecheck --error-exitcode 9 $B/m3 logits -m $W/x2 --ids "$sids" --ubatch 8 --decode 1 --backend cuda -o $W/cs.st > $W/rc-f$f.log 2>&1
  echo "[$SECONDS] racecheck fuse $f rc $? $(grep -E 'RACECHECK SUMMARY' $W/rc-f$f.log | head -1)"
  grep -E "^========= +(Error|Warning)|in k_|Write Thread|Read Thread" $W/rc-f$f.log | sed -E 's/ +/ /g' | sort | uniq -c | sort -rn | head -12
done
} 2>&1 | tee $OUT/checks.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
for f in 0 1; do
  M3_MOE_FUSE=$f timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $B/m3 bench --random-weights --config $S --layers 5 --batch 1 --context 8192 --steps 2 --prefill 0 > $W/ncu-f$f.csv 2> $W/ncu-f$f.err
  echo "[$SECONDS] ncu fuse $f rc $? $(wc -l < $W/ncu-f$f.csv) lines"
done
tar -C $W -cJf $OUT/ncu.tar.xz ncu-f0.csv ncu-f1.csv rc-f1.log rc-f0.log
cat $W/b8-f1-r1.log > $OUT/b8-f1-r1.log
