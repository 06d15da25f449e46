#!/usr/bin/env bash
# session 25 call 6: the final tree (the device budget left no room for the whole section 9, run in
# call 2 at f395bda; since then only the engine's host code changed): greedy equality with the draft on
# the GPU (k 1, 3, 7) and vLLM's keys, test_spec_engine section 5 on the GPU, speculation toggling under load
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/dsp /tmp/load-*
$B/m3 make-tiny --out /tmp/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
dids=$(seq -s, 3 40)
plain=$($B/m3 generate -m /tmp/dsp --ids $dids -n 40 --ignore-eos --backend cuda 2>/dev/null)
for cfg in '"num_speculative_tokens":1' '"num_speculative_tokens":3' '"num_speculative_tokens":7' \
           '"num_speculative_tokens":5,"disable_by_batch_size":2' '"num_speculative_tokens":5,"max_model_len":60,"draft_tensor_parallel_size":1'; do
  spec=$($B/m3 generate -m /tmp/dsp --ids $dids -n 40 --ignore-eos --backend cuda \
    --speculative-config "{\"method\":\"dspark\",$cfg}" 2>$L/gen.err)
  [ -n "$plain" ] && [ "$plain" = "$spec" ] && echo "ok {$cfg}: greedy tokens equal, $(grep -o '[0-9]* verify steps' $L/gen.err)" || echo "FAILED {$cfg}"
done
echo "[$SECONDS] test_spec_engine sampled (GPU)"
timeout 120 $B/test_spec_engine /tmp/dsp sampled cuda > $L/spec-engine.log 2>&1; echo "rc $?"
grep -E "^5\.|FAIL|passed" $L/spec-engine.log | cut -c1-200
echo "[$SECONDS] served, 64 x 2 rounds, disable_by_batch_size 40"
M3_LOAD_LEVELS=64 M3_LOAD_ROUNDS=2 M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7,"disable_by_batch_size":40}' \
  timeout 200 scripts/gpu-serve-load.sh $B /tmp/load-toggle /tmp/tok.json > $L/load-toggle.log 2>&1; echo "rc $?"
grep -E "^\| 64 |spec_decode_num_(drafts|decodes_without_drafts)_total|serve load|FAILED" $L/load-toggle.log | cut -c1-200
echo "[$SECONDS] done"
