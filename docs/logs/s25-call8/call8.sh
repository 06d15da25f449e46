#!/usr/bin/env bash
# session 25 call 8 (NOT RUN: no device time left; the next session can run it as is): where the batch-8 draft's time goes (4.9 ms against a 1.4 ms floor): m3 bench
# --profile at 30 layers, batch 8 (per-op GPU time of 3 drafts; the decode and verify per op too)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 8 --context 8192 --steps 5 \
  --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json --profile > $L/bench30-b8-profile.log 2>&1; echo "rc $?"
sed -n '/dspark draft per op/,$p' $L/bench30-b8-profile.log | head -40
echo "[$SECONDS] done"
