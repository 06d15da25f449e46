#!/usr/bin/env bash
# Session 45, call 3: token tiles of 64 with two CTAs an SM (M3_GEMM_TC_CPS64=2: 4 consumer warps a
# scheduler instead of 2; the MoE's 64-row rest tiles were latency-bound, s45 call 1's ncu) against
# the default: ragged checks, GEMM / MoE timings, kernel durations (ncu), the 8-layer bench
# (prefill, decode at batch 1 / 8 / 64); on an H200 the 30-layer dspark bench; memchecks.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs moved aside): END=470 bash .gpu_pack/call3.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-470}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
NEW="M3_GEMM_TC_CPS64=2"
{
for v in "$NEW" "$NEW M3_GEMM_TC_MXB=0"; do
  env $v timeout 90 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged, $v rc $?"; grep FAIL $W/gr.log | head -5; tail -1 $W/gr.log
done
env $NEW timeout 150 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged, $NEW rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
for r in 1 2; do for shp in "12288 6144" "6144 3072"; do for v in "M3_GEMM_TC_DEFAULT=1" "$NEW"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $v (round $r)"
  env $v timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -iE "^(mxfp8|nvfp4|bf16) .* (64|256) |FAIL|passed" | cut -c1-100
done; done; done
for r in 1 2; do for v in "M3_GEMM_TC_DEFAULT=1" "$NEW"; do
  echo "== [$SECONDS] bench_cuda_moe --only 512,1024,4096, $v (round $r)"; env $v timeout 60 $B/bench_cuda_moe --only 512,1024,4096 2>&1 | grep -E "^ +[0-9]+ |FAIL|passed"
done; done
for v in "M3_GEMM_TC_DEFAULT=1" "$NEW"; do
  env $v timeout 120 ncu --kernel-name-base demangled -k 'regex:k_gemm_tc<\(int\)4, \(int\)64' --launch-skip 2 --launch-count 4 \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active $B/bench_cuda_moe --only 4096 > $W/ncu.log 2>&1
  echo "== [$SECONDS] ncu MoE 4096 64-row kernels, $v rc $?"
  grep -E "^  [a-z].*k_gemm_tc<|gpu__time|smsp__inst|warps_active" $W/ncu.log | sed -E 's/^ +//; s/\(<unnamed>::gemm_args\).*//' | paste - - - - | cut -c1-220
done
i=0
for v in "M3_GEMM_TC_DEFAULT=1" "$NEW" "M3_GEMM_TC_DEFAULT=1" "$NEW"; do
  i=$((i+1)); [ $(left) -gt 200 ] || break
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8,64 --context 8192 --steps 5 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill|^ +(1|8|64) +8192" -A2 $W/pn$i.log | cut -c1-330
done
cp $W/pn1.log $W/pn2.log $OUT/ 2>/dev/null
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 170 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
CS="compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20"
if [ $(left) -gt 60 ]; then
  env $NEW timeout 60 $CS $B/bench_cuda_gemm --ragged > $W/cs1.log 2>&1; echo "[$SECONDS] memcheck gemm ragged, $NEW rc $?"; tail -2 $W/cs1.log
fi
if [ $(left) -gt 60 ]; then
  env $NEW timeout $(( $(left) - 10 )) $CS $B/bench_cuda_moe --ragged > $W/cs2.log 2>&1; echo "[$SECONDS] memcheck moe ragged, $NEW rc $?"; tail -2 $W/cs2.log
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call3.log
