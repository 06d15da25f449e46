#!/usr/bin/env bash
# Session 41, call 2 (the warm machine of call 1, with cluster.diff applied): ncu of the first 3 k_gemm_tc
# launches of a 4096-token prefill at one layer, clusters of 2 and without
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
for c in 2 1; do M3_GEMM_TC_CLUSTER=$c timeout 95 $NCU --kernel-name regex:k_gemm_tc --launch-count 3 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy $B/m3 bench --random-weights --config $S --layers 1 --batch 1 --context 4096 --steps 1 --prefill 4096 > $OUT/ncu-c$c.txt 2>&1; echo "c$c rc $?"; done
