#!/usr/bin/env bash
# session 21 call 2: the indexer's bf16 staging as whole-sector copies (idx_stage_cpa, every bf16
# cache): bench_cuda_attn (and M3_INDEX_CPA=0), m3 bench at 8 layers, memcheck, gpu.sh section 1
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn"
timeout 90 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $?"
M3_INDEX_CPA=0 M3_BENCH_KV=bf16 timeout 60 $B/bench_cuda_attn > $L/attn-cpa0.log 2>&1; echo "rc $?"
grep -E "^(bf16|fp8|nvfp4)|passed|FAIL" $L/attn.log; grep -E "^bf16" $L/attn-cpa0.log
save
echo "[$SECONDS] m3 bench"
timeout 90 $B/m3 bench --random-weights --config $C --layers 8 --batch 1,8,16,64,256 --context 8192 --prefill 4096 --verify 7 --profile > $L/bench8.log 2>&1
echo "rc $?"; grep -E "^(1|8|16|64|256) |^prefill|verify pass" $L/bench8.log
for r in 1 2 3; do
  timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 64,256 --context 8192 --prefill 0 --steps 10 > $L/b-$r.log 2>&1
  echo "default: $(grep -E '^(64|256) ' $L/b-$r.log | awk '{printf "%s %s %s | ", $1, $3, $6}')"
done
M3_INDEX_CPA=0 timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 64,256 --context 8192 --prefill 0 --steps 10 > $L/b-cpa0.log 2>&1
echo "cpa 0: $(grep -E '^(64|256) ' $L/b-cpa0.log | awk '{printf "%s %s %s | ", $1, $3, $6}')"
save
echo "[$SECONDS] memcheck"
for cs in 2 3; do
  M3_BENCH_CASE=$cs M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 100 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-mem-$cs.log 2>&1
  echo "memcheck case $cs rc $? $(tail -1 $L/cs-mem-$cs.log)"
done
save
echo "[$SECONDS] section 1"
M3_GPU_SECTIONS=1 timeout $((560 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s1.log 2>&1; echo "s1 rc $?"; grep -E "FAILED|checks failed" $L/s1.log | head
echo "[$SECONDS] done"
