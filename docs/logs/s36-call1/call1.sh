#!/usr/bin/env bash
# session 36 call 1: session 35's call 2 (the references with the GEMV ring across items, now the
# default, and ncu of the grouped NVFP4 MoE GEMV k_gemv_mma<NVFP4, HL 1, ring> at 8 tokens), then on
# an H200 gpu.sh section 4 (the 30-layer benches) and section 1 with the time left.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
mkdir -p /tmp/oc
for m in m3-tiny m3-tiny-q m3-gqa3-q m3-mqa-q; do
  timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.oracle.safetensors --backend cuda --tol 1e-3 --work /tmp/oc 2>&1 | tail -1 | sed "s/^/$m: /"
done
echo "[$SECONDS] oracle checks done"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu 2>/dev/null | head -1)
timeout 200 $NCU --kernel-name-base mangled --kernel-name regex:_Z10k_gemv_mmaILi4ELi1ELi0E --launch-skip 8 --launch-count 4 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section SourceCounters \
  $B/m3 bench --random-weights --config $S --layers 4 --batch 8 --context 8192 --steps 3 --prefill 0 > $OUT/ncu-moe8.txt 2>&1
echo "[$SECONDS] ncu rc $?"
grep -E "k_gemv_mma|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit" $OUT/ncu-moe8.txt | head -60
secs="1"; [ "${gmem:-0}" -ge 120000 ] && secs="4 1"
for s in $secs; do
  left=$((585 - SECONDS)); [ $left -gt 30 ] || break
  M3_GPU_SECTIONS=$s timeout $left scripts/gpu.sh .gpu_bin /tmp/w$s > $OUT/s$s.log 2>&1
  echo "[$SECONDS] section $s rc $?"; grep -E "FAILED|checks failed" $OUT/s$s.log | head -20 | cut -c1-240
done
