#!/usr/bin/env bash
# session 26 call 3: k_dsa_flash with balanced runs and each chunk's P V summed apart (the draft's attention, a run of key chunks per CTA) against the CPU and
# against k_dsa_chunk (M3_DSA_FLASH=0): bench_cuda_attn, compute-sanitizer on it, m3 bench at 30 layers
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
for f in 0 1; do
  M3_DSA_FLASH=$f M3_BENCH_CASE=0 timeout 120 $B/bench_cuda_attn > $L/attn-flash$f.log 2>&1; echo "flash $f rc $?"
  sed -n '/dspark attention/,$p' $L/attn-flash$f.log
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck synccheck; do
  M3_BENCH_CASE=0 M3_BENCH_REPS=1 timeout 300 $CS --tool $tool --kernel-name kns=dsa --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/attn-$tool.log 2>&1
  echo "[$SECONDS] $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/attn-$tool.log | head -2 | tr '\n' ' ')"
done
for f in 1 0; do
  M3_DSA_FLASH=$f timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/bench30-flash$f.log 2>&1; echo "flash $f rc $?"
  grep -E "^(1|8) |dspark \(k|whole step" $L/bench30-flash$f.log | cut -c1-240
done
M3_DSA_FLASH=1 timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 8 --context 8192 --steps 5 \
  --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json --profile > $L/bench30-b8-profile.log 2>&1; echo "rc $?"
sed -n '/dspark draft per op/,$p' $L/bench30-b8-profile.log | head -4
echo "[$SECONDS] done"
