#!/usr/bin/env bash
# Session 45, call 1: the new defaults as built (MXFP8 by bit placement, MXFP8 tiles of 256 in half
# stages) checked and timed against the old ones (M3_GEMM_TC_MXB=0 M3_GEMM_TC_HS=0); the half-stage
# consumer that expands before its x wait (this build, .gpu_bin) against session 44's (b27eb5b,
# .gpu_old: bench_cuda_gemm / bench_cuda_moe only); on an H200 the 30-layer dspark bench; ncu of the
# MoE's 64-row rest tiles against its 256-row tiles; a memcheck of half stages.
# usage (after scripts/gpu-bin.sh; old.tar.xz and this file in .gpu_pack; docs/logs moved aside):
#   END=460 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin .gpu_old && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && tar -C .gpu_old -xJf .gpu_pack/old.tar.xz
B=.gpu_bin; O=.gpu_old; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-460}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
OLD="M3_GEMM_TC_MXB=0 M3_GEMM_TC_HS=0"
{
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_BN=256" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=192" "$OLD"; do
  env $v timeout 90 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged, $v rc $?"; grep FAIL $W/gr.log | head -5; tail -1 $W/gr.log
done
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_HS=1"; do
  env $v timeout 150 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged, $v rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
done
for shp in "12288 6144" "6144 3072"; do
  for v in "M3_GEMM_TC_DEFAULT=1" "$OLD" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256"; do for bin in $B $O; do
    echo "== [$SECONDS] bench_cuda_gemm $shp, $v, $bin"
    env $v timeout 60 $bin/bench_cuda_gemm $shp 2>&1 | grep -iE "^(mxfp8|nvfp4)|FAIL|passed" | cut -c1-120
  done; done
done
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_HS=1" "M3_MOE_TC_FAT320=1"; do for bin in $B $O; do
  echo "== [$SECONDS] bench_cuda_moe --only 4096, $v, $bin"; env $v timeout 60 $bin/bench_cuda_moe --only 4096 2>&1 | grep -vE "^device"
done; done
i=0
for v in "M3_GEMM_TC_DEFAULT=1" "$OLD" "M3_GEMM_TC_DEFAULT=1" "$OLD"; do
  i=$((i+1)); [ $(left) -gt 200 ] || break
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill|^ +(1|8) +8192" -A2 $W/pn$i.log | cut -c1-330
done
cp $W/pn1.log $W/pn2.log $OUT/ 2>/dev/null
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 170 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
CS="compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20"
if [ $(left) -gt 80 ]; then
  M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256 timeout 60 $CS $B/bench_cuda_gemm --ragged > $W/cs1.log 2>&1; echo "[$SECONDS] memcheck gemm ragged HS 256 rc $?"; tail -2 $W/cs1.log
fi
if [ $(left) -gt 40 ]; then
  # one 64-row rest tile launch and one 256-row launch of the MoE at 4096 tokens (gate + up), all sections
  timeout $(( $(left) - 10 )) ncu --kernel-name-base demangled -k "regex:k_gemm_tc<4, (64|256), 1, 2, 0, 0>" --launch-skip 4 --launch-count 2 \
    --set full -o $W/moe $B/bench_cuda_moe --only 4096 > $W/ncu.log 2>&1; echo "[$SECONDS] ncu rc $?"; tail -3 $W/ncu.log
  ncu -i $W/moe.ncu-rep --page details > $OUT/ncu-moe-details.txt 2>&1
  ncu -i $W/moe.ncu-rep --page raw --csv > $W/raw.csv 2>&1 && xz -9 -c $W/raw.csv > $OUT/ncu-moe-raw.csv.xz
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call1.log
