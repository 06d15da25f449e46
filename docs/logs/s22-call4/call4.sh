#!/usr/bin/env bash
# session 22 call 4: the combine with a warp per eighth of the chunks (four chunks' loads at a time), the
# eight warps' sums added in shared memory: bench_cuda_attn, memcheck, ncu, the draft at 30 layers,
# gpu.sh section 9
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn"
M3_BENCH_KV=bf16 timeout 90 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $? $(tail -1 $L/attn.log)"
grep -A14 "^dspark attention" $L/attn.log; grep FAIL $L/attn.log | head
save
echo "[$SECONDS] memcheck case 0"
M3_BENCH_CASE=0 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 120 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-0.log 2>&1
echo "rc $? $(tail -1 $L/cs-0.log)"
save
echo "[$SECONDS] ncu: k_dsa_chunk and k_dsa_combine"
M3_BENCH_CASE=0 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 150 $NCU --kernel-name regex:"k_dsa_c" --launch-count 6 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis $B/bench_cuda_attn > $L/ncu-dsa.log 2>&1
echo "rc $?"; grep -E "^  k_dsa|Duration|Compute \(SM\) Throughput|Memory Throughput|Grid Size|Achieved Occupancy|Issue Slots Busy|Executed Ipc A" $L/ncu-dsa.log | cut -c1-110 | head -70
save
echo "[$SECONDS] dspark 30 layers"
timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
  --dspark-config $D --profile > $L/bench30.log 2>&1; echo "rc $?"; grep -E "^(1|8) |verify pass|dspark|draft per op" -A1 $L/bench30.log | grep -v "^--"
save
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout $((560 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"; grep -E "FAILED|checks failed|ERROR SUMMARY|copy_n|dspark \(|whole step" $L/s9.log | head -20; tail -3 $L/s9.log
echo "[$SECONDS] done"
