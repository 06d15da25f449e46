#!/usr/bin/env bash
# Session 41, call 3: why the wgmma GEMM's tensor pipe idles (~43-48% of the time at 4096 tokens): ncu's
# warp-state, scheduler, pipe and instruction sections with details, for the first k_gemm_tc launch of a
# 4096-token prefill (a dense NVFP4 linear in 192-token tiles) and launches 28-35 of a 4-layer prefill
# (the MoE layer's grouped gate + up and down among them)
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
SEC="--section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section SpeedOfLight --print-details all"
timeout 60 $NCU --kernel-name regex:k_gemm_tc --launch-count 1 $SEC $B/m3 bench --random-weights --config $S --layers 1 --batch 1 --context 4096 --steps 1 --prefill 4096 > $OUT/ncu-dense.txt 2>&1; echo "dense rc $?"
timeout 90 $NCU --kernel-name regex:k_gemm_tc --launch-skip 27 --launch-count 8 $SEC $B/m3 bench --random-weights --config $S --layers 4 --batch 1 --context 4096 --steps 1 --prefill 4096 > $OUT/ncu-moe.txt 2>&1; echo "moe rc $?"
grep -E "k_gemm_tc|Duration|Stall|Issue Slots|Eligible|No Eligible|Pipe|Tensor" $OUT/ncu-dense.txt | head -40
