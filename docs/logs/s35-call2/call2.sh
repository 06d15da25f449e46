#!/usr/bin/env bash
# session 35 call 2: what bounds the grouped NVFP4 MoE GEMV at 8 tokens (k_gemv_mma<NVFP4, HL 1, ring>):
# ncu on a batch-8 decode step of 4 layers at the M3.1-Flash shapes (gate + up and down launches of one
# step), with the sections that say where its warps wait and what its memory does.
# usage (after scripts/gpu-bin.sh; carry .gpu_pack with this file copied in): bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# the references with the ring across items on (the pack's binaries predate the default): every position within 1e-3
export M3_GV_XITEM=1; mkdir -p /tmp/oc
for m in m3-tiny m3-tiny-q m3-gqa3-q m3-mqa-q; do
  timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.oracle.safetensors --backend cuda --tol 1e-3 --work /tmp/oc 2>&1 | tail -1 | sed "s/^/$m: /"
done
echo "[$SECONDS] oracle checks done"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
timeout 250 $NCU --kernel-name-base mangled --kernel-name regex:_Z10k_gemv_mmaILi4ELi1ELi0E --launch-skip 8 --launch-count 4 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section SourceCounters \
  $B/m3 bench --random-weights --config $S --layers 4 --batch 8 --context 8192 --steps 3 --prefill 0 > $OUT/ncu-moe8.txt 2>&1
echo "[$SECONDS] ncu rc $?"
grep -E "k_gemv_mma|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit" $OUT/ncu-moe8.txt | head -60
