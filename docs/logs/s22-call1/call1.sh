#!/usr/bin/env bash
# session 22 call 1: the DSpark attention on the tensor cores (M3_DSA_MMA=1, k_dsa_chunk_mma) and the
# refactored default k_dsa_chunk: bench_cuda_attn check + times, memcheck, the draft at 30 layers,
# gpu.sh section 9 with the new kernel
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn: default, M3_DSA_MMA=1"
M3_BENCH_KV=bf16 timeout 90 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $? $(tail -1 $L/attn.log)"
M3_DSA_MMA=1 M3_BENCH_KV=bf16 timeout 90 $B/bench_cuda_attn > $L/attn-mma.log 2>&1; echo "rc $? $(tail -1 $L/attn-mma.log)"
for f in attn attn-mma; do echo "== $f"; grep -A14 "^dspark attention" $L/$f.log; grep FAIL $L/$f.log | head; done
save
echo "[$SECONDS] memcheck M3_DSA_MMA=1 case 0"
M3_DSA_MMA=1 M3_BENCH_CASE=0 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 120 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-mma.log 2>&1
echo "rc $? $(tail -1 $L/cs-mma.log)"
save
echo "[$SECONDS] dspark 30 layers, default then M3_DSA_MMA=1"
for v in 0 1; do
  M3_DSA_MMA=$v timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
    --dspark-config $D --profile > $L/bench30-mma$v.log 2>&1; echo "mma $v rc $?"; grep -E "^(1|8) |dspark \(|draft per op" -A1 $L/bench30-mma$v.log | grep -v "^--"
  save
done
echo "[$SECONDS] section 9 with M3_DSA_MMA=1"
M3_DSA_MMA=1 M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout $((560 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"; grep -E "FAILED|checks failed|ERROR SUMMARY" $L/s9.log | head -20; tail -3 $L/s9.log
echo "[$SECONDS] done"
