#!/usr/bin/env bash
# session 27 call 10: issue 27's numbers at the final tree (d5993c6: the side stream, the smaller decode
# kernels): m3 bench 30 layers batch 1 and 8 with the draft
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call10/call10.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
timeout 120 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 1,8 --context 8192 --steps 10 \
  --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/bench30.log 2>&1; echo "[$SECONDS] bench rc $?"
grep -E "^(1|8) |verify pass|dspark \(k|whole step|projection" $L/bench30.log | cut -c1-260
