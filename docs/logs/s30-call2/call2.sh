#!/usr/bin/env bash
# session 30 call 2: prompt logprobs on the GPU (test_prompt_logprobs cuda: the engine's prompt rows
# through the CUDA forward against the reference and the engine's own generation), then gpu.sh
# section 9's served runs as session 27 call 8 ran them (the server speculating greedy at 1 / 16 / 64
# streams, and the toggle run: 64 x 2, disable_by_batch_size 40)
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack with bin.tar.xz and tokenizer.json.xz):
#   bash docs/logs/s30-call2/call2.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
M3_PRECISION=exact timeout 120 $B/test_prompt_logprobs tests/data/m3-tiny cuda > $L/plp.log 2>&1; echo "[$SECONDS] test_prompt_logprobs cuda rc $?"
cat $L/plp.log | cut -c1-240 | head -20
save
M3_LOAD_LEVELS=1,16,64 M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}' \
  timeout 200 scripts/gpu-serve-load.sh $B /tmp/w/load-spec /tmp/tok.json > $L/load-spec.log 2>&1; echo "[$SECONDS] load-spec rc $?"
grep -E "FAILED|ok |conc|^ *[0-9]+ |spec_decode_num_(drafts|accepted)" $L/load-spec.log | cut -c1-200 | head -20
save
M3_LOAD_LEVELS=64 M3_LOAD_ROUNDS=2 M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7,"disable_by_batch_size":40}' \
  timeout $((520 - SECONDS)) scripts/gpu-serve-load.sh $B /tmp/w/load-spec-toggle /tmp/tok.json > $L/load-toggle.log 2>&1; echo "[$SECONDS] toggle rc $?"
grep -E "FAILED|ok |conc|^ *[0-9]+ |without_drafts|finished" $L/load-toggle.log | cut -c1-200 | head -20
echo "[$SECONDS] done"
