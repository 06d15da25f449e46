#!/usr/bin/env bash
# Session 43, call 1 (session 42's call 2, unrun, with 256-row MoE tiles added: M3_MOE_TC_BN=256 in
# the ragged MoE checks, bench_cuda_moe's 2048 / 4096 lines and the 8-layer prefill): (1) the wgmma GEMM experiments checked on the ragged shapes: one n192 wgmma a k16 step for
# 192-token tiles (M3_GEMM_TC_N192=1), 256-token NVFP4 tiles with setmaxnreg (M3_GEMM_TC_BN=256);
# (2) timed against the default at 12288 x 6144 and 6144 x 3072, and the 8-layer 4096-token prefill
# with N192; (3) ncu's warp states with details (s41-call2/call3.sh); (4) three A buffers
# (M3_GEMM_TC_NB=3) timed; (5) on an H200 the 30-layer dspark bench; (6) the session-40 memchecks.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; .gpu_pack with this file,
# s41-call2/call3.sh and s40-call5/call5.sh copied in): END=560 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-480}
left() { echo $((END - SECONDS)); }
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
{
M3_GEMM_TC_N192=1 M3_GEMM_TC_BN=192 timeout 60 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged 192, N192 rc $?"; grep -c FAIL $W/gr.log; tail -1 $W/gr.log
M3_GEMM_TC_BN=256 timeout 60 $B/bench_cuda_gemm --ragged > $W/g256.log 2>&1; echo "[$SECONDS] gemm ragged 256 rc $?"; grep -c FAIL $W/g256.log; tail -1 $W/g256.log
M3_GEMM_TC_N192=1 timeout 120 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged (tiles of 256 too), N192 rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
cp $W/gr.log $W/g256.log $W/mr.log $OUT/
for shp in "12288 6144" "6144 3072"; do for v in "M3_GEMM_TC_N192=0" "M3_GEMM_TC_N192=1" "M3_GEMM_TC_BN=256"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $v"
  env $v timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -vE "^device"
done; done
i=0
for v in "M3_GEMM_TC_N192=0" "M3_GEMM_TC_N192=1" "M3_MOE_TC_BN=256" "M3_MOE_TC_BN=256 M3_GEMM_TC_BN=256" "M3_GEMM_TC_N192=0" "M3_MOE_TC_BN=256"; do
  i=$((i+1)); [ $(left) -gt 330 ] || break
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 2 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill" -A3 $W/pn$i.log | cut -c1-300; cp $W/pn$i.log $OUT/
done
} 2>&1 | tee $OUT/call1.log
[ $(left) -gt 200 ] && { bash .gpu_pack/call3.sh 2>&1 | tee -a $OUT/call1.log; }
{
if [ $(left) -gt 60 ]; then
  for v in "M3_GEMM_TC_NB=2 M3_GEMM_TC_BN=128" "M3_GEMM_TC_NB=3 M3_GEMM_TC_BN=128"; do
    echo "== [$SECONDS] bench_cuda_gemm 12288 6144, $v"
    env $v timeout 60 $B/bench_cuda_gemm 12288 6144 2>&1 | grep -vE "^device"
  done
fi
for nb in 2 3; do
  [ $(left) -gt 70 ] || break
  echo "== [$SECONDS] bench_cuda_moe, M3_GEMM_TC_NB=$nb"
  M3_GEMM_TC_NB=$nb timeout 100 $B/bench_cuda_moe 2>&1 | grep -vE "^device" | tail -16
done
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 110 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
} 2>&1 | tee -a $OUT/call1.log
[ $(left) -gt 100 ] && OUT=$W timeout $(left) bash .gpu_pack/call5.sh 2>&1 | tee -a $OUT/call1.log
echo "[$SECONDS] done" | tee -a $OUT/call1.log
