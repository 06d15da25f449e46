#!/usr/bin/env bash
# session 21 call 1: the indexer's resident CTAs (k_index_scores_pipe): bench_cuda_attn with and
# without (M3_INDEX_PIPE=0), sanitizer (memcheck, racecheck) on its cases, m3 bench A/B at batch
# 64 / 256 and verify passes, gpu.sh section 8
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn, pipe on / off"
M3_BENCH_KV=bf16 timeout 60 $B/bench_cuda_attn > $L/attn-pipe1.log 2>&1; echo "rc $?"
M3_INDEX_PIPE=0 M3_BENCH_KV=bf16 timeout 60 $B/bench_cuda_attn > $L/attn-pipe0.log 2>&1; echo "rc $?"
grep -E "^bf16|passed|FAIL" $L/attn-pipe1.log; grep -E "^bf16" $L/attn-pipe0.log
save
for r in 1 2; do for p in 1 0; do
  M3_INDEX_PIPE=$p timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 64,256 --context 8192 --prefill 0 --steps 10 > $L/b-$p-$r.log 2>&1
  echo "pipe $p: $(grep -E '^(64|256) ' $L/b-$p-$r.log | awk '{printf "%s %s %s | ", $1, $3, $6}')"
done; done
M3_INDEX_PIPE=1 timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 8,64,256 --context 8192 --prefill 0 --steps 10 --verify 7 --profile > $L/bv-1.log 2>&1
M3_INDEX_PIPE=0 timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 8,64,256 --context 8192 --prefill 0 --steps 10 --verify 7 --profile > $L/bv-0.log 2>&1
for p in 1 0; do echo "pipe $p"; grep -E "^(8|64|256) |verify pass|indexer" $L/bv-$p.log | sed 's/embed.*indexer/indexer/; s/attention.*//'; done
save
echo "[$SECONDS] sanitizer"
for cs in 3 4; do
  M3_BENCH_CASE=$cs M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 100 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-mem-$cs.log 2>&1
  echo "memcheck case $cs rc $? $(tail -1 $L/cs-mem-$cs.log)"
done
M3_BENCH_CASE=3 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 150 $CSB --tool racecheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-race-3.log 2>&1
echo "racecheck case 3 rc $? $(tail -2 $L/cs-race-3.log | head -c 300)"
save
echo "[$SECONDS] section 8"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS=8 timeout $((560 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s8.log 2>&1; echo "s8 rc $?"; grep -E "^\| *(1|16|64|128|256) |FAILED|checks failed" $L/s8.log
echo "[$SECONDS] done"
