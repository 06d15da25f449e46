#!/usr/bin/env bash
# session 36 call 3 (device time short: the failed starts cost it): gpu.sh section 9's 30-layer
# benchmark alone on an H200 (m3 bench --dspark-config: issue 27's acceptance 2), twice; 16 layers on
# an 80 GB card. Section 9's checks ran in session 33 on 4fdcb16; call 1 checked this tree's GEMV.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call3.sh   (after call2.sh in the same call: the binaries are unpacked already)
set -u
[ -x .gpu_bin/m3 ] || { mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=16; [ "${gmem:-0}" -ge 120000 ] && L=30
for r in 1 2; do
  timeout 200 .gpu_bin/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers $L --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $OUT/bench$L-dspark-r$r.log 2>&1
  echo "[$SECONDS] bench $L layers r$r rc $?"
  grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $OUT/bench$L-dspark-r$r.log | cut -c1-200
done
