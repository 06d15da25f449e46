#!/usr/bin/env bash
# Session 45, call 6: the MoE's h staged by the gate + up GEMM's epilogue (bf16, straight into the
# down GEMM's staged layout) against M3_MOE_TC_HSTAGE=0 (f32 h, then its own staging launch): the
# ragged MoE checks both ways (their errors must agree to the digit: the same bf16 h), timings, the
# 8-layer prefill, a memcheck.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs moved aside): END=240 bash .gpu_pack/call6.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-240}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
OLD="M3_MOE_TC_HSTAGE=0"
{
for v in "M3_MOE_TC_HSTAGE=1" "$OLD"; do
  env $v timeout 150 $B/bench_cuda_moe --ragged > $W/mr-$v.log 2>&1; echo "[$SECONDS] moe ragged, $v rc $?"; grep -E "FAIL|passed" $W/mr-$v.log | head -5
  grep -E "^ +[0-9]+ " $W/mr-$v.log | awk '{print $1, $2, $3, $4, $5}' > $W/err-$v.txt
done
cmp $W/err-M3_MOE_TC_HSTAGE=1.txt $W/err-$OLD.txt && echo "errors equal both ways ($(wc -l < $W/err-$OLD.txt) cases)" || { echo "ERRORS DIFFER"; diff $W/err-M3_MOE_TC_HSTAGE=1.txt $W/err-$OLD.txt | head; }
for r in 1; do for v in "M3_MOE_TC_HSTAGE=1" "$OLD"; do
  echo "== [$SECONDS] bench_cuda_moe --only 1024,4096, $v (round $r)"; env $v timeout 60 $B/bench_cuda_moe --only 1024,4096 2>&1 | grep -E "^ +[0-9]+ |FAIL|passed"
done; done
i=0
for v in "M3_MOE_TC_HSTAGE=1" "$OLD"; do
  i=$((i+1)); [ $(left) -gt 60 ] || break
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 3 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill" -A2 $W/pn$i.log | cut -c1-330
done
CS="compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20"
if [ $(left) -gt 40 ]; then
  timeout $(( $(left) - 5 )) $CS $B/bench_cuda_moe --ragged > $W/cs.log 2>&1; echo "[$SECONDS] memcheck moe ragged rc $?"; tail -2 $W/cs.log
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call6.log
