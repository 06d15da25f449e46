#!/usr/bin/env bash
# session 27 call 1: session 26's call 11 (736918e's shared device helpers of the draft attention, never run:
# bench_cuda_attn in all three variants against the CPU, memcheck / racecheck, dspark_check at the draft's
# shapes), then the baseline: m3 bench 30 layers with the draft and per-op profile, and each kernel's time of
# a 4-layer decode step at batch 1 and 8 (ncu, graphs off) to see what a layer spends outside its kernels
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call1/call1.sh
set -u
cd "$(dirname "$0")/../../.."
bash docs/logs/s26-call11/call11.sh
mv /tmp/logs /tmp/logs11 2>/dev/null
B=.gpu_bin; L=/tmp/logs; W=/tmp/w1; rm -rf $L $W; mkdir -p $L $W; mv /tmp/logs11 $L/call11
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json
timeout 150 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --steps 10 \
  --prefill 0 --verify 7 --dspark-config $D --profile > $L/bench30.log 2>&1; echo "[$SECONDS] bench rc $?"
grep -E "^(1|8) |per step|verify pass|dspark|floor" $L/bench30.log | cut -c1-300
save
which nsys; ls /usr/local/cuda/bin | tr '\n' ' '; echo
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in 1 8; do
  M3_CUDA_GRAPHS=0 timeout 200 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    --csv --page raw --launch-count 700 $B/m3 bench --random-weights --config $C --layers 4 --batch $b --context 2048 --steps 1 --prefill 0 \
    > $L/ncu-b$b.csv 2> $L/ncu-b$b.err; echo "[$SECONDS] ncu b$b rc $? $(wc -l < $L/ncu-b$b.csv) lines"
  save
done
echo "[$SECONDS] done"
