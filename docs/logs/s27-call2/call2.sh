#!/usr/bin/env bash
# session 27 call 2: graph_regrow with failing recordings (fault module "graph": the first recording,
# then every one; graphs stay on), m3 bench 30 layers with --profile at batch 1 and 8 (the dspark bench's
# profile section no longer reads the sampled drafts' freed samplers: call 1 segfaulted there), and each
# kernel's time of a 4-layer decode step at batch 1 and 8 (ncu, graphs off, weight-building kernels skipped)
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call2/call2.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; W=/tmp/w2; rm -rf $L $W; mkdir -p $L $W
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json
python3 scripts/cut-layers.py $C 2 $W/flash2.json
$B/m3 make-tiny --out $W/flash2 --config $W/flash2.json --quant mxfp8-nvfp4 --seed 5 > $L/mk.log 2>&1
timeout 200 $B/graph_regrow $W/flash2 > $L/graph_regrow.log 2>&1; echo "[$SECONDS] graph_regrow rc $?"; cat $L/graph_regrow.log | cut -c1-250
save
timeout 200 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --steps 10 \
  --prefill 0 --verify 7 --dspark-config $D --profile > $L/bench30.log 2>&1; echo "[$SECONDS] bench rc $?"
grep -E "^(1|8) |per step|verify pass|dspark" $L/bench30.log | cut -c1-300
save
for g in 0 1; do
  M3_CUDA_GRAPHS=$g timeout 100 $B/m3 bench --random-weights --config $C --layers 4 --batch 1,8 --context 2048 --steps 20 --prefill 0 > $L/bench4-g$g.log 2>&1
  echo "graphs $g: $(grep -E '^(1|8) ' $L/bench4-g$g.log | tr -s ' ' | tr '\n' ';')"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in 1 8; do
  M3_CUDA_GRAPHS=0 timeout 150 $NCU --clock-control none --kernel-name regex:'^(?!k_rand|k_fill)' \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    --csv --page raw --launch-count 400 $B/m3 bench --random-weights --config $C --layers 4 --batch $b --context 2048 --steps 2 --prefill 0 \
    > $L/ncu-b$b.csv 2> $L/ncu-b$b.err; echo "[$SECONDS] ncu b$b rc $? $(grep -c '^"' $L/ncu-b$b.csv) rows"
  grep -E "^(1|8) " $L/ncu-b$b.csv
  save
done
echo "[$SECONDS] done"
