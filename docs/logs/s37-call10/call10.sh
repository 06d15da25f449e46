#!/usr/bin/env bash
# session 37 call 10 (the device time nearly spent): on an H200 only, the 30-layer m3 bench
# --dspark-config once at this tree (issue 27, acceptance 2).
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call10.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${gmem:-0}" -ge 120000 ] || { echo "not an H200: the 30-layer bench needs 141 GB"; exit 3; }
timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 \
  --steps 10 --prefill 0 --verify 7 --dspark-config $D > $OUT/bench30-dspark.log 2>&1
echo "[$SECONDS] bench 30 layers dspark rc $?"
grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
