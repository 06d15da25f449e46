#!/usr/bin/env bash
# session 37 call 8 (call 1 again, at HEAD: no H200 came for it before): on an H200, the 30-layer m3 bench --dspark-config (issue 27's acceptance 2),
# twice; then every kernel's duration (ncu at the GPU's own clock) in a batch-1 decode step and a
# batch-1 verify of 8 at 5 layers (3 dense + 2 MoE), to see where a MoE layer's time goes.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=16; [ "${gmem:-0}" -ge 120000 ] && L=30
for r in 1 2; do
  timeout 200 $B/m3 bench --random-weights --config $S --layers $L --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config $D > /tmp/bench$L-r$r.log 2>&1
  echo "[$SECONDS] bench $L layers r$r rc $?"
  grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" /tmp/bench$L-r$r.log | cut -c1-220
done
cat /tmp/bench$L-r1.log /tmp/bench$L-r2.log > $OUT/bench$L-dspark.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
timeout 300 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
  $B/m3 bench --random-weights --config $S --layers 5 --batch 1 --context 8192 --steps 1 --prefill 0 --verify 7 \
  > /tmp/ncu-b1.csv 2> /tmp/ncu-b1.err
echo "[$SECONDS] ncu rc $? $(wc -l < /tmp/ncu-b1.csv) lines"
tail -3 /tmp/ncu-b1.err
xz -9 -c /tmp/ncu-b1.csv > $OUT/ncu-b1.csv.xz
ls -la $OUT
