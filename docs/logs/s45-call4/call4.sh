#!/usr/bin/env bash
# Session 45, call 4: the default as built (MXFP8 / NVFP4 tiles of 64 at two CTAs an SM): gpu.sh
# section 3 (every kernel bench's checks and timings, the old paths beside), the 8-layer bench; on
# an H200 the 30-layer dspark bench.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs moved aside): END=520 bash .gpu_pack/call4.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-520}
left() { echo $((END - SECONDS)); }
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
{
M3_GPU_SECTIONS="3" timeout 400 scripts/gpu.sh $B $W/g > $OUT/s3.log 2>&1; echo "[$SECONDS] gpu.sh section 3 rc $?"
grep -E "^FAILED|FAIL " $OUT/s3.log | head -10
if [ $(left) -gt 60 ]; then
  timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --profile > $OUT/pn1.log 2>&1
  echo "[$SECONDS] 8 layers rc $?"; grep -E "^prefill" -A2 $OUT/pn1.log | cut -c1-330
fi
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 110 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call4.log
