#!/usr/bin/env bash
# session 20 call 3: the indexer's copies-only staging (bf16 cache) against the general one
# (M3_INDEX_CPA=0): bench_cuda_attn, batch 256 and 64 steps, sanitizer; then gpu.sh section 1
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for v in 1 0; do
  echo "[$SECONDS] M3_INDEX_CPA=$v"
  M3_INDEX_CPA=$v timeout 100 $B/bench_cuda_attn > $L/attn-cpa$v.log 2>&1; echo "attn rc $? $(tail -1 $L/attn-cpa$v.log)"
  grep -E "^bf16" $L/attn-cpa$v.log
done
save
for r in 1 2; do for v in 1 0; do
  M3_INDEX_CPA=$v timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 64,256 --context 8192 --prefill 0 --steps 10 --profile > $L/b256-cpa$v-$r.log 2>&1
  echo "cpa $v run $r rc $?"; grep -E "^(64|256) " $L/b256-cpa$v-$r.log; grep "per step" $L/b256-cpa$v-$r.log | grep -o "indexer [0-9.]* ms"
done; done
save
echo "[$SECONDS] sanitizer: attention (case 2) with the new staging"
M3_BENCH_CASE=2 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 100 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-attn.log 2>&1
echo "rc $? $(tail -1 $L/cs-attn.log)"
save
echo "[$SECONDS] section 1"
M3_GPU_SECTIONS=1 timeout $((585 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s1.log 2>&1; echo "s1 rc $?"; grep -E "FAILED|checks failed" $L/s1.log | head -20
echo "[$SECONDS] done"
