#!/usr/bin/env bash
# Session 42, call 1: (1) 256-token tiles for NVFP4 (M3_GEMM_TC_BN=256: n256 wgmmas, 128 accumulators a
# thread by setmaxnreg) checked on the ragged shapes and timed; 192-token tiles by one n192 wgmma a k16 step instead of an n128 and an n64 on
# the same A registers (M3_GEMM_TC_N192=1): the ragged shapes in full, the MoE's ragged checks, then
# timed against the default (12288 x 6144 and 6144 x 3072, the MoE op, the 8-layer 4096-token
# prefill); (2) on an H200, the 30-layer figures of issue 27 (dspark step at batch 1 and 8) and the
# 30-layer prefill; (3) session 41's prepared call (s41-next/next1.sh: M3_GEMM_TC_NB=3 checked and
# timed, ncu warp states, gpu.sh section 3, the session-40 memchecks) in the time left.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; .gpu_pack with this file, s41-next/next1.sh,
# s41-call2/call3.sh and s40-call5/call5.sh copied in): END=560 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-560}
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
{
M3_GEMM_TC_N192=1 M3_GEMM_TC_BN=192 timeout 60 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged 192, N192 rc $?"; grep -c FAIL $W/gr.log; tail -1 $W/gr.log
M3_GEMM_TC_N192=1 timeout 60 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged, N192 rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
for shp in "12288 6144" "6144 3072"; do for v in "M3_GEMM_TC_N192=0" "M3_GEMM_TC_N192=1"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $v"
  env $v timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -vE "^device"
done; done
M3_GEMM_TC_BN=256 timeout 60 $B/bench_cuda_gemm --ragged > $W/g256.log 2>&1; echo "[$SECONDS] gemm ragged 256 rc $?"; grep -c FAIL $W/g256.log; tail -1 $W/g256.log
for shp in "12288 6144" "6144 3072" "8192 6144"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, M3_GEMM_TC_BN=256 (NVFP4 above 192 tokens)"
  M3_GEMM_TC_BN=256 timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -E "^nvfp4|FAIL"
done
for v in 0 1 0 1; do
  M3_GEMM_TC_N192=$v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 2 --prefill 4096 --profile > $W/pn$v.log 2>&1
  echo "== [$SECONDS] 8 layers, M3_GEMM_TC_N192=$v rc $?"; grep -E "^prefill" -A3 $W/pn$v.log | cut -c1-300
done
cp $W/pn0.log $W/pn1.log $OUT/
for v in 0 1; do
  echo "== [$SECONDS] bench_cuda_moe, M3_GEMM_TC_N192=$v"
  M3_GEMM_TC_N192=$v timeout 100 $B/bench_cuda_moe 2>&1 | grep -vE "^device" | tail -14
done
} 2>&1 | tee $OUT/call1.log
if [ "${gmem:-0}" -ge 120000 ]; then
  {
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
  timeout 120 $B/m3 bench --random-weights --config $S --layers 30 --batch 1 --context 4096 --steps 2 --prefill 4096 --profile > $OUT/p30.log 2>&1
  echo "[$SECONDS] 30 layers prefill 4096 rc $?"; grep -E "^prefill|per op" -A1 $OUT/p30.log | tail -3 | cut -c1-300
  } 2>&1 | tee $OUT/h200.log
fi
END=$((END - SECONDS)) bash .gpu_pack/next1.sh
