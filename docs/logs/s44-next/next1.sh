#!/usr/bin/env bash
# Session 44's next call: the new defaults as built (MXFP8 by bit placement, MXFP8 tiles of 256 in
# half stages) checked and timed against the old ones (M3_GEMM_TC_MXB=0 M3_GEMM_TC_HS=0) in one
# binary; on an H200 the 30-layer dspark bench; memchecks of the default 256 paths.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; this file in .gpu_pack): END=400 bash .gpu_pack/next1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-400}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
OLD="M3_GEMM_TC_MXB=0 M3_GEMM_TC_HS=0"
{
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_BN=256" "$OLD"; do
  env $v timeout 90 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged, $v rc $?"; grep FAIL $W/gr.log | head -5; tail -1 $W/gr.log
done
timeout 150 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
for shp in "12288 6144" "6144 3072" "8192 6144" "6144 8192"; do for v in "M3_GEMM_TC_DEFAULT=1" "$OLD"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $v"
  env $v timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -iE "^(mxfp8|nvfp4)|FAIL|passed" | cut -c1-120
done; done
for v in "M3_GEMM_TC_DEFAULT=1" "$OLD"; do
  echo "== [$SECONDS] bench_cuda_moe --only 4096, $v"; env $v timeout 60 $B/bench_cuda_moe --only 4096 2>&1 | grep -vE "^device"
done
i=0
for v in "M3_GEMM_TC_DEFAULT=1" "$OLD" "M3_GEMM_TC_DEFAULT=1" "$OLD"; do
  i=$((i+1)); [ $(left) -gt 150 ] || break
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill|^ +(1|8) +8192" -A2 $W/pn$i.log | cut -c1-330
done
cp $W/pn1.log $W/pn2.log $OUT/ 2>/dev/null
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 130 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
CS="compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20"
if [ $(left) -gt 60 ]; then
  M3_GEMM_TC_BN=256 timeout $(left) $CS $B/bench_cuda_gemm --ragged > $W/cs1.log 2>&1; echo "[$SECONDS] memcheck gemm ragged 256 rc $?"; tail -2 $W/cs1.log
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/next1.log
