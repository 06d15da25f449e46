#!/usr/bin/env bash
# session 26 call 11 (NOT RUN: no device time left; the next session's first call): the draft attention's
# kernels after 736918e (scores, mask, P fragments and part heads shared by k_dsa_chunk and k_dsa_flash: same
# arithmetic in the PTX, not yet run) against the CPU in all three variants, under compute-sanitizer, and the
# draft at the M3.1-Flash draft shapes (dspark_check: drafts the CPU's, 14 graph replays)
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s26-call11/call11.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; W=/tmp/w11; rm -rf $L $W; mkdir -p $L $W
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
for v in "" M3_DSA_FLASH=0 M3_DSA_TRUNC=0; do
  env $v M3_BENCH_CASE=0 timeout 120 $B/bench_cuda_attn > $L/attn-${v:-default}.log 2>&1; echo "${v:-default} rc $?"
  sed -n '/dspark attention (8/,$p' $L/attn-${v:-default}.log
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  for v in "" M3_DSA_FLASH=0; do
    env $v M3_BENCH_CASE=0 M3_BENCH_REPS=1 timeout 300 $CS --tool $tool --kernel-name kns=dsa --error-exitcode 99 --print-limit 20 \
      $B/bench_cuda_attn > $L/attn-$tool-${v:-default}.log 2>&1
    echo "[$SECONDS] $tool ${v:-default} rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/attn-$tool-${v:-default}.log | head -1)"
  done
done
python3 scripts/cut-layers.py tests/data/m3.1-flash-shapes.json 2 $W/flash2.json
$B/m3 make-tiny --out $W/flash2 --config $W/flash2.json --quant mxfp8-nvfp4 --seed 5 --with-dspark > $L/mk.log 2>&1
timeout 200 $B/dspark_check $W/flash2 > $L/dspark-check-flash2.log 2>&1; echo "[$SECONDS] dspark_check flash2 rc $?"
grep -E "FAIL|one request|greedy drafts|teacher" $L/dspark-check-flash2.log | cut -c1-260
echo "[$SECONDS] done"
