#!/usr/bin/env bash
# session 24 call 1: verify_rows (sampled drafts verified on the GPU): dspark_check (GPU vs CPU),
# sanitizers on the verify kernel, section 9's checks (test_spec_engine section 5 on the GPU, sampled
# repeatability, memcheck of a sampled speculative run), the served sampled + speculating load at
# 1 / 16 / 64 streams; ncu of one draw_rows launch (what bounds the draw kernel)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/load-* /tmp/w /tmp/dsp
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
$B/m3 make-tiny --out /tmp/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
echo "[$SECONDS] dspark_check"
timeout 60 $B/dspark_check /tmp/dsp > $L/dspark_check.log 2>&1; echo "rc $?"
grep -E "draw_rows|verify_rows|probabilistic|ok:|FAIL" $L/dspark_check.log | cut -c1-220
for tool in memcheck racecheck synccheck; do
  echo "[$SECONDS] $tool (ops only, k_verify_rows)"
  timeout 90 $CS --tool $tool --kernel-name kns=k_verify_rows --error-exitcode 99 --print-limit 20 $B/dspark_check --ops-only /tmp/dsp \
    > $L/ops-$tool.log 2>&1; echo "$tool rc $?"; grep -E "SUMMARY|FAIL|ok:" $L/ops-$tool.log | head -4
done
save
echo "[$SECONDS] memcheck: sampled speculative generate"
dids=$(seq -s, 3 40)
timeout 120 $CS --tool memcheck --error-exitcode 99 --print-limit 20 $B/m3 generate -m /tmp/dsp --ids $dids -n 16 --ignore-eos \
  --backend cuda --temperature 0.8 --seed 5 --speculative-config '{"method":"dspark","num_speculative_tokens":3}' > $L/gen-memcheck.log 2>&1
echo "rc $?"; grep -E "SUMMARY|dspark:" $L/gen-memcheck.log | cut -c1-250
echo "[$SECONDS] test_spec_engine sampled (GPU)"
timeout 120 $B/test_spec_engine /tmp/dsp sampled cuda > $L/spec-engine.log 2>&1; echo "rc $?"
grep -E "^5\.|FAIL" $L/spec-engine.log | cut -c1-260
save
echo "[$SECONDS] served, sampled + speculating, 1 / 16 / 64 streams"
M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,16,64 M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}' \
  timeout 200 scripts/gpu-serve-load.sh $B /tmp/load-ss /tmp/tok.json > $L/load-spec-sampled.log 2>&1
echo "rc $?"; grep -E "^\| |FAILED|MAL|serve load|on_device" $L/load-spec-sampled.log | head -10
save
echo "[$SECONDS] ncu: one draw_rows launch (32 rows of 200,064)"
timeout 120 $NCU --set full -k regex:k_draw_rows -c 1 $B/dspark_check --ops-only /tmp/dsp > $L/ncu-draw.log 2>&1; echo "rc $?"
grep -E "Duration|Throughput|Warp Cycles|Issue Slots|Stall|Achieved Occupancy|Registers|Shared Memory" $L/ncu-draw.log | head -30
echo "[$SECONDS] done"
