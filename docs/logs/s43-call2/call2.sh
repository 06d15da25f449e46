#!/usr/bin/env bash
# Session 43, call 2: the new defaults checked and timed against the old in one binary: NVFP4 linears
# in 256-token tiles where their waves take less time (gemm_tiles.h), 192-token tiles by one n192
# wgmma, the MoE's NVFP4 experts in 256-row tiles from 256 slots an expert; MXFP8 at 256 tokens
# forced (M3_GEMM_TC_BN=256, an experiment: 2 stages of 82 KB). Then memchecks of the 256 paths.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; this file in .gpu_pack): END=420 bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-420}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
{
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_BN=256" "M3_GEMM_TC_N192=0 M3_GEMM_TC_BN=192"; do
  env $v timeout 90 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged, $v rc $?"; grep -c FAIL $W/gr.log; tail -1 $W/gr.log
done
timeout 150 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5; cp $W/mr.log $OUT/
for shp in "12288 6144" "6144 3072"; do for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_BN=256" "M3_GEMM_TC_N192=0"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $v"
  env $v timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -vE "^device"
done; done
i=0
for v in "M3_GEMM_TC_DEFAULT=1" "M3_MOE_TC_BN=128 M3_GEMM_TC_N192=0" "M3_GEMM_TC_BN=256" "M3_GEMM_TC_DEFAULT=1" "M3_MOE_TC_BN=128 M3_GEMM_TC_N192=0"; do
  i=$((i+1)); [ $(left) -gt 200 ] || break
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill|^ +(1|8) +8192" -A2 $W/pn$i.log | cut -c1-330
done
cp $W/pn1.log $W/pn2.log $OUT/ 2>/dev/null
if [ $(left) -gt 110 ]; then
  echo "== [$SECONDS] bench_cuda_moe"
  timeout 100 $B/bench_cuda_moe 2>&1 | grep -vE "^device" | tail -16
fi
CS="compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20"
if [ $(left) -gt 60 ]; then
  M3_GEMM_TC_BN=256 timeout $(left) $CS $B/bench_cuda_gemm --ragged > $W/cs1.log 2>&1; echo "[$SECONDS] memcheck gemm ragged 256 rc $?"; tail -2 $W/cs1.log
fi
if [ $(left) -gt 60 ]; then
  timeout $(left) $CS $B/bench_cuda_moe --ragged > $W/cs2.log 2>&1; echo "[$SECONDS] memcheck moe ragged rc $?"; tail -2 $W/cs2.log
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call2.log
