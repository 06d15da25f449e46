#!/usr/bin/env bash
# session 25 call 3: served load on the 6-layer real-format checkpoint, 1 / 16 / 64 streams: plain
# decoding, then speculating (k 7) with vLLM's "disable_by_batch_size": 16, greedy and sampled
# (T 0.8, top-p 0.95): past 16 running requests the steps decode without drafts
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/load-*
SPEC='{"method":"dspark","num_speculative_tokens":7,"disable_by_batch_size":16}'
echo "[$SECONDS] plain"
M3_LOAD_LEVELS=1,16,64 timeout 200 scripts/gpu-serve-load.sh $B /tmp/load-plain /tmp/tok.json > $L/load-plain.log 2>&1; echo "rc $?"
echo "[$SECONDS] speculating, disable_by_batch_size 16, greedy"
M3_LOAD_LEVELS=1,16,64 M3_LOAD_SPEC="$SPEC" timeout 200 scripts/gpu-serve-load.sh $B /tmp/load-spec /tmp/tok.json > $L/load-spec.log 2>&1; echo "rc $?"
echo "[$SECONDS] speculating, disable_by_batch_size 16, sampled"
M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,16,64 M3_LOAD_SPEC="$SPEC" timeout 200 scripts/gpu-serve-load.sh $B /tmp/load-spec-sampled /tmp/tok.json > $L/load-spec-sampled.log 2>&1; echo "rc $?"
for f in plain spec spec-sampled; do
  echo "== $f"; grep -E "^\| (1|16|64) |spec_decode_num_(drafts|decodes_without)_total|mean_accepted|serve load|FAILED" $L/load-$f.log | cut -c1-200
done
echo "[$SECONDS] done"
