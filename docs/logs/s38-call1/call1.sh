#!/usr/bin/env bash
# session 38 call 1: gpu.sh section 1 at 2f4270f (session 37's last CUDA commits, never run on a
# GPU: the M3_ROUND_IN_LOAD bit-equality check among them); on an H200 the 30-layer m3 bench
# --dspark-config (issue 27); then ncu's per-kernel durations of a 4096-token prefill at 5 layers
# (3 dense + 2 MoE): where the prefill's MoE time goes.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${gmem:-0}" -ge 120000 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 layers dspark rc $?"
  grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
M3_GPU_SECTIONS=1 timeout 260 scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?"; grep -E "FAILED|checks failed|ROUND_IN_LOAD|round" $OUT/s1.log | head -20 | cut -c1-240
$B/m3 bench --random-weights --config $S --layers 5 --batch 1 --context 4096 --steps 2 --prefill 4096 --profile > $OUT/bench5-prefill.log 2>&1
echo "[$SECONDS] bench5 rc $?"; grep -E "prefill|per op" -A1 $OUT/bench5-prefill.log | cut -c1-300
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
left=$((580 - SECONDS)); [ $left -gt 200 ] && left=200
timeout $left $NCU --metrics gpu__time_duration.sum,dram__bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active --csv \
  $B/m3 bench --random-weights --config $S --layers 5 --batch 1 --context 4096 --steps 1 --prefill 4096 > $OUT/ncu-prefill5.csv 2>&1
echo "[$SECONDS] ncu rc $? lines $(wc -l < $OUT/ncu-prefill5.csv)"
