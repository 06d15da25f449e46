#!/usr/bin/env bash
# session 23 call 2: served sampled requests (T 0.8, top-p 0.95) at 1 and 64 streams, the draws on the
# device (draw_rows) against the host (M3_DRAWS=host); then speculating (DSpark k 7, draft on the GPU)
# with sampled requests at 1, 16 and 64 streams (the drafts' draws on the device)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
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
echo "[$SECONDS] done"
