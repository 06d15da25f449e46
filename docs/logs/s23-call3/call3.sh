#!/usr/bin/env bash
# session 23 call 3: draw_rows with each CTA's slice in shared memory (the default now) and without
# (M3_DRAW_SMEM=0): dspark_check against the CPU, racecheck / synccheck on the draw kernel
# (dspark_check --ops-only), the bench's sampled drafts at 30 layers; the server speculating greedy
# at 1 / 16 / 64 streams (issue 27 acceptance 3) and served sampled requests at 64
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/load-* /tmp/w /tmp/dsp
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
$B/m3 make-tiny --out /tmp/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
for sm in 1 0; do
  echo "[$SECONDS] dspark_check M3_DRAW_SMEM=$sm"
  M3_DRAW_SMEM=$sm timeout 60 $B/dspark_check /tmp/dsp > $L/dspark_check-smem$sm.log 2>&1; echo "rc $?"
  grep -E "draw_rows|probabilistic|ok:|FAIL" $L/dspark_check-smem$sm.log | cut -c1-200
done
for tool in memcheck racecheck synccheck; do
  echo "[$SECONDS] $tool (ops only)"
  timeout 90 $CS --tool $tool --kernel-name kns=k_draw_rows --error-exitcode 99 --print-limit 20 $B/dspark_check --ops-only /tmp/dsp \
    > $L/ops-$tool.log 2>&1; echo "$tool rc $?"; grep -E "SUMMARY|FAIL|ok:" $L/ops-$tool.log | head -4
done
save
echo "[$SECONDS] bench 30 layers"
timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
  --dspark-config $D > $L/bench30.log 2>&1; echo "rc $?"; grep -E "^(1|8) |dspark drafts of sampled|whole step" $L/bench30.log | cut -c1-250
save
echo "[$SECONDS] speculating, greedy, 1 / 16 / 64 streams"
M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}' M3_LOAD_LEVELS=1,16,64 \
  timeout 130 scripts/gpu-serve-load.sh $B /tmp/load-spec-g /tmp/tok.json > $L/load-spec-greedy.log 2>&1
echo "rc $?"; grep -E "^\| |FAILED|MAL|serve load" $L/load-spec-greedy.log | head -8
save
echo "[$SECONDS] served, sampled, 1 / 64 streams"
M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,64 timeout 110 scripts/gpu-serve-load.sh $B /tmp/load-s /tmp/tok.json \
  > $L/load-sampled.log 2>&1; echo "rc $?"; grep -E "^\| |FAILED|serve load" $L/load-sampled.log | head -5
echo "[$SECONDS] done"
