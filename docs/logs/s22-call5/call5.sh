#!/usr/bin/env bash
# session 22 call 5: the draft block's residual adds fused with the norms after them (add_rmsnorm):
# the draft at 30 layers (twice), gpu.sh section 9 (GPU draft against the CPU's, sanitizer);
# bench_cuda_attn with a 20000-key window (313 chunks: two tiles of the combine's weights), memcheck
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn, memcheck case 0"
M3_BENCH_KV=bf16 timeout 90 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $? $(tail -1 $L/attn.log)"
grep -A15 "^dspark attention" $L/attn.log; grep FAIL $L/attn.log | head
M3_BENCH_CASE=0 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 150 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-0.log 2>&1
echo "memcheck rc $? $(tail -1 $L/cs-0.log)"
save
echo "[$SECONDS] dspark 30 layers (twice)"
for r in 1 2; do
  timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
    --dspark-config $D --profile > $L/bench30-$r.log 2>&1; echo "run $r rc $?"; grep -E "^(1|8) |verify pass|dspark|draft per op" -A1 $L/bench30-$r.log | grep -v "^--"
  save
done
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout $((380 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"; grep -E "FAILED|checks failed|ERROR SUMMARY|copy_n|teacher|greedy drafts" $L/s9.log | head -20; tail -3 $L/s9.log
echo "[$SECONDS] done"
