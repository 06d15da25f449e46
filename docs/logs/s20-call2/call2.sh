#!/usr/bin/env bash
# session 20 call 2: the DSpark draft's batched append / attention, device greedy chain and split
# argmax (bench_cuda_attn, gpu.sh section 9, sanitizer), the draft per op at 30 layers, and a
# fresh server with the two-round warm-up and the step trace
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn"
timeout 150 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $?"; grep -A12 "^dspark attention" $L/attn.log | tail -14
save
echo "[$SECONDS] dspark 30 layers"
timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
  --dspark-config $D --profile > $L/bench30-dspark.log 2>&1; echo "rc $?"; grep -E "^(1|8) |dspark" $L/bench30-dspark.log; grep -A1 "draft per op" $L/bench30-dspark.log
save
echo "[$SECONDS] served, fresh server, step trace"
M3_STEP_TRACE=$L/trace.txt M3_LOAD_LEVELS=64,64 timeout 170 scripts/gpu-serve-load.sh $B /tmp/load /tmp/tok.json > $L/serve.log 2>&1
echo "serve rc $?"; grep -E "^\| *64|FAILED" $L/serve.log | head; grep warm-up /tmp/load/serve.log; cp /tmp/load/serve.log $L/server.log
save
echo "[$SECONDS] sanitizer: attention (case 2)"
M3_BENCH_CASE=2 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 120 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-attn.log 2>&1
echo "rc $? $(tail -1 $L/cs-attn.log)"
save
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout $((585 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"; grep -E "FAILED|checks failed|^ok|argmax_rows|teacher|confidence|greedy drafts|ERROR SUMMARY" $L/s9.log | head -40
echo "[$SECONDS] done"
