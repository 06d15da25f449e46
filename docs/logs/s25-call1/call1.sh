#!/usr/bin/env bash
# session 25 call 1 (session 24 call 6 as planned): the
# draw kernel with its candidates in global scratch (a1ba065) under memcheck
# (the ops alone and a sampled speculative run), test_spec_engine section 5 on the GPU, the sampled
# repeatability check of gpu.sh section 9
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/dsp
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
$B/m3 make-tiny --out /tmp/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
for sm in 1 0; do
  echo "[$SECONDS] memcheck ops only, M3_DRAW_SMEM=$sm"
  M3_DRAW_SMEM=$sm timeout 90 $CS --tool memcheck --error-exitcode 99 --print-limit 20 $B/dspark_check --ops-only /tmp/dsp \
    > $L/ops-memcheck-smem$sm.log 2>&1; echo "rc $?"; grep -E "SUMMARY|FAIL|ok:|draw_rows" $L/ops-memcheck-smem$sm.log | cut -c1-200 | head -4
done
dids=$(seq -s, 3 40)
echo "[$SECONDS] memcheck: sampled speculative generate (top-p 0.9)"
timeout 120 $CS --tool memcheck --error-exitcode 99 --print-limit 20 $B/m3 generate -m /tmp/dsp --ids $dids -n 16 --ignore-eos \
  --backend cuda --temperature 0.8 --top-p 0.9 --seed 5 --speculative-config '{"method":"dspark","num_speculative_tokens":3}' > $L/gen-memcheck.log 2>&1
echo "rc $?"; grep -E "SUMMARY|dspark:" $L/gen-memcheck.log | cut -c1-250
echo "[$SECONDS] test_spec_engine sampled (GPU)"
timeout 120 $B/test_spec_engine /tmp/dsp sampled cuda > $L/spec-engine.log 2>&1; echo "rc $?"
grep -E "^5\.|FAIL" $L/spec-engine.log | cut -c1-200
for run_i in 1 2; do
  $B/m3 generate -m /tmp/dsp --ids $dids -n 40 --ignore-eos --temperature 0.8 --top-p 0.9 --seed 3 --backend cuda \
    --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > /tmp/s.$run_i 2>$L/gen-$run_i.err; echo "generate $run_i rc $?"
done
cmp -s /tmp/s.1 /tmp/s.2 && echo "ok sampled speculative runs repeatable: $(grep -o 'MAL [0-9.]*' $L/gen-1.err)" || echo "FAILED: runs differ"
echo "[$SECONDS] done"
