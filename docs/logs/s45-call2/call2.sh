#!/usr/bin/env bash
# Session 45, call 2: wgmma descriptors by adds (desc_lo: one add a k16 step instead of ~5
# instructions) against b27eb5b (.gpu_old: bench_cuda_gemm / bench_cuda_moe of session 44's tree, the
# same kernels otherwise): every wgmma path's ragged checks, GEMM and MoE timings, the MoE kernels'
# instruction counts (ncu), the 8-layer prefill; on an H200 the 30-layer dspark bench; a memcheck.
# usage (after scripts/gpu-bin.sh; old.tar.xz and this file in .gpu_pack; docs/logs moved aside):
#   END=470 bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin .gpu_old && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && tar -C .gpu_old -xJf .gpu_pack/old.tar.xz
B=.gpu_bin; O=.gpu_old; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-470}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
{
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_BN=256" "M3_GEMM_TC_BN=192" "M3_GEMM_TC_N192=0 M3_GEMM_TC_BN=192" \
         "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256" "M3_GEMM_TC_HS=1 M3_GEMM_TC_N192=0 M3_GEMM_TC_BN=192" "M3_GEMM_TC_NB=3" "M3_GEMM_TC_CPS=2" "M3_GEMM_TC_MXB=0"; do
  env $v timeout 90 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged, $v rc $?"; grep FAIL $W/gr.log | head -5; tail -1 $W/gr.log
done
timeout 150 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
for r in 1 2; do for shp in "12288 6144" "6144 3072"; do for bin in $B $O; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $bin (round $r)"
  timeout 60 $bin/bench_cuda_gemm $shp 2>&1 | grep -iE "^(mxfp8|nvfp4|bf16)|FAIL|passed" | cut -c1-100
done; done; done
for r in 1 2; do for bin in $B $O; do
  echo "== [$SECONDS] bench_cuda_moe --only 2048,4096, $bin (round $r)"; timeout 60 $bin/bench_cuda_moe --only 2048,4096 2>&1 | grep -E "^ +[0-9]+ |FAIL|passed"
done; done
for bin in $B $O; do
  timeout 120 ncu --kernel-name-base demangled -k 'regex:k_gemm_tc<' --launch-skip 20 --launch-count 24 \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__grid_size $bin/bench_cuda_moe --only 4096 > $W/ncu.log 2>&1
  echo "== [$SECONDS] ncu MoE 4096 kernels, $bin rc $?"
  grep -E "k_gemm_tc<|gpu__time|smsp__inst" $W/ncu.log | sed -E 's/^ +//; s/\(<unnamed>::gemm_args\).*//' | paste - - - | awk '{print $0}' | cut -c1-200 | head -24
done
for i in 1 2; do
  [ $(left) -gt 200 ] || break
  timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8,64 --context 8192 --steps 3 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers rc $?"; grep -E "^prefill|^ +(1|8|64) +8192" -A2 $W/pn$i.log | cut -c1-330
done
cp $W/pn1.log $OUT/ 2>/dev/null
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 170 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
CS="compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20"
if [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 10 )) $CS $B/bench_cuda_gemm --ragged > $W/cs1.log 2>&1; echo "[$SECONDS] memcheck gemm ragged rc $?"; tail -2 $W/cs1.log
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call2.log
