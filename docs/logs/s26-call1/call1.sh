#!/usr/bin/env bash
# session 26 call 1: where the draft's time goes at batch 8 and 1 (m3 bench --profile at 30 layers: per-op GPU
# time of the drafts, the decode and the verify), then gpu.sh section 9 whole (session 25's new lines: vLLM keys
# in m3 generate, the served toggle run; the bench's m3_rng_normal rows)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
for b in 8 1; do
  timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch $b --context 8192 --steps 5 \
    --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json --profile > $L/bench30-b$b-profile.log 2>&1; echo "rc $?"
  sed -n '/dspark draft per op/,$p' $L/bench30-b$b-profile.log | head -40
done
echo "[$SECONDS] gpu.sh section 9"
M3_GPU_SECTIONS=9 M3_TOKENIZER=/tmp/tok.json timeout 330 scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1; echo "rc $?"
grep -E "^ok|FAILED|checks failed|^\| (1|16|64) |whole step|projection" $L/s9.log | cut -c1-220
echo "[$SECONDS] done"
