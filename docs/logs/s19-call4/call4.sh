#!/usr/bin/env bash
# session 19 call 4 (the committed tree): accuracy (gpu.sh section 1), GEMM / MoE checks and
# sanitizer on the changed kernels, served 64 streams (twice), m3 bench 8 layers, 30-layer prefill
set -u
cd "$(dirname "$0")/.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] section 1"
M3_GPU_SECTIONS=1 timeout 220 scripts/gpu.sh $B /tmp/w > $L/s1.log 2>&1; echo "s1 rc $?"; grep -E "FAILED|checks failed|all .* passed" $L/s1.log | head -20; save
echo "[$SECONDS] checks"
timeout 100 $B/bench_cuda_gemm --quick > $L/gemm.log 2>&1; echo "gemm rc $? $(tail -1 $L/gemm.log)"
grep -E "^bf16 +(8192|512) +6144 +(16|32) " $L/gemm.log
timeout 60 $B/bench_cuda_moe --quick > $L/moe.log 2>&1; echo "moe rc $? $(tail -1 $L/moe.log)"
M3_MOE_TC_TAIL=0 timeout 40 $B/bench_cuda_moe --ragged > $L/moe-notail.log 2>&1; echo "moe notail rc $? $(tail -1 $L/moe-notail.log)"
timeout 60 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_gemm --ragged > $L/cs-gemm.log 2>&1; echo "cs gemm rc $? $(tail -1 $L/cs-gemm.log)"
timeout 60 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_moe --ragged > $L/cs-moe.log 2>&1; echo "cs moe rc $? $(tail -1 $L/cs-moe.log)"
save
echo "[$SECONDS] served"
M3_LOAD_LEVELS=64,64 timeout 170 scripts/gpu-serve-load.sh $B /tmp/load /tmp/tok.json > $L/serve.log 2>&1; echo "serve rc $?"; grep -E "^ *64|concurrency|FAILED|ok " $L/serve.log | head; save
echo "[$SECONDS] bench"
timeout 80 $B/m3 bench --random-weights --config $C --layers 8 --batch 1,8,16,64,256 --context 8192 --prefill 4096 --verify 7 --profile > $L/bench8.log 2>&1
echo "bench rc $?"; grep -E "^(1|8|16|64|256) |^prefill|verify" $L/bench8.log | head -20; save
if [ $SECONDS -lt 520 ]; then
  timeout $((580 - SECONDS)) $B/m3 bench --random-weights --config $C --layers 30 --batch 1 --context 8192 --steps 5 --prefill 4096 > $L/bench30.log 2>&1
  echo "bench30 rc $?"; grep -E "^prefill|^1 " $L/bench30.log
fi
echo "[$SECONDS] done"
