#!/usr/bin/env bash
# session 23 call 2: served sampled requests (T 0.8, top-p 0.95) at 1 and 64 streams, the draws on the
# device (draw_rows) against the host (M3_DRAWS=host); then speculating (DSpark k 7, draft on the GPU)
# with sampled requests at 1, 16 and 64 streams (the drafts' draws on the device), and greedy (issue 27
# acceptance 3: call 1's section 9 ran it without the tokenizer); the bench's sampled drafts at 30 layers
# (q rows page-locked now); memcheck on a sampled speculative generate
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
echo "[$SECONDS] bench 30 layers"
timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
  --dspark-config $D > $L/bench30.log 2>&1; echo "rc $?"; grep -E "^(1|8) |verify pass|dspark" $L/bench30.log | cut -c1-250
save
echo "[$SECONDS] served, sampled (T 0.8, top-p 0.95), 1 and 64 streams: draws on the device, then on the host"
for how in backend host; do
  M3_DRAWS=$how M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,64 M3_TOKENIZER=/tmp/tok.json timeout 170 \
    scripts/gpu-serve-load.sh $B /tmp/load-$how /tmp/tok.json > $L/load-sampled-$how.log 2>&1
  echo "$how rc $?"; grep -E "^\| |FAILED" $L/load-sampled-$how.log | head -6
  save
done
echo "[$SECONDS] speculating, sampled, 1 / 16 / 64 streams"
M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}' M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,16,64 \
  timeout 200 scripts/gpu-serve-load.sh $B /tmp/load-spec /tmp/tok.json > $L/load-spec-sampled.log 2>&1
echo "rc $?"; grep -E "^\| |FAILED|MAL|accept" $L/load-spec-sampled.log | head -12
save
echo "[$SECONDS] speculating, greedy, 1 / 16 / 64 streams"
M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}' M3_LOAD_LEVELS=1,16,64 \
  timeout 150 scripts/gpu-serve-load.sh $B /tmp/load-spec-g /tmp/tok.json > $L/load-spec-greedy.log 2>&1
echo "rc $?"; grep -E "^\| |FAILED|MAL|accept" $L/load-spec-greedy.log | head -12
save
echo "[$SECONDS] memcheck, sampled speculative generate"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
$B/m3 make-tiny --out /tmp/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
timeout 100 $CS --tool memcheck --error-exitcode 99 --print-limit 20 $B/m3 generate -m /tmp/dsp --ids 5,17,300,2,499 -n 24 --ignore-eos \
  --backend cuda --temperature 0.8 --top-p 0.95 --seed 3 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}' > $L/memcheck-sampled.log 2>&1
echo "rc $?"; grep -E "ERROR SUMMARY|MAL" $L/memcheck-sampled.log
echo "[$SECONDS] done"
