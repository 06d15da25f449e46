#!/usr/bin/env bash
# Session 45, call 5 (an H200 only: 30 layers need its memory): issue 27's 30-layer dspark bench at
# batch 1 and 8 on this tree's kernels.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs moved aside): bash .gpu_pack/call5.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
for r in 1 2; do
  timeout 150 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark-r$r.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark-r$r.log | cut -c1-230
done
