#!/usr/bin/env bash
# Session 45's next call (an H200 if one comes; on an H100 the 30-layer bench is skipped): the
# 30-layer dspark bench (issue 27) at batch 1 and 8, then the part of gpu.sh section 3 that session
# 45's call 4 did not reach (the older alternates: forced 192 / 256, NB 3, n128 + n64, half stages
# everywhere, MXB 0), each on this tree's kernels (MXFP8 / NVFP4 64-token tiles at two
# CTAs an SM by default).
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs moved aside; tests/data/m3-wide-q*
# too if the tree is over 64 MiB): END=540 bash .gpu_pack/next1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-540}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
{
if [ "${gmem:-0}" -ge 120000 ]; then
  for r in 1 2; do
    timeout 150 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
      --dspark-config $D > $OUT/bench30-dspark-r$r.log 2>&1
    echo "[$SECONDS] bench 30 dspark rc $?"
    grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark-r$r.log | cut -c1-230
  done
fi
for v in "M3_GEMM_TC_BN=192" "M3_GEMM_TC_N192=0 M3_GEMM_TC_BN=192" "M3_GEMM_TC_BN=256" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256" \
         "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=192" "M3_GEMM_TC_HS=0 M3_GEMM_TC_BN=256" "M3_GEMM_TC_MXB=0" "M3_GEMM_TC_MXB=0 M3_GEMM_TC_BN=256" \
         "M3_GEMM_TC_CPS64=1 M3_GEMM_TC_NB=3"; do
  [ $(left) -gt 40 ] || break
  env $v timeout 90 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged, $v rc $?"; grep FAIL $W/gr.log | head -5; tail -1 $W/gr.log
done
for v in "M3_GEMM_TC_NB=3" "M3_GEMM_TC_N192=0" "M3_GEMM_TC_HS=1"; do
  [ $(left) -gt 60 ] || break
  env $v timeout 150 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged, $v rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
done
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/next1.log
