#!/usr/bin/env bash
# session 26 call 7: what bounds k_dsa_flash (ncu: speed of light, pipes, warp states, instruction mix)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M3_BENCH_CASE=0 M3_BENCH_REPS=1 timeout 200 $NCU --kernel-name regex:"k_dsa_flash" --launch-count 12 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section InstructionStats $B/bench_cuda_attn > $L/ncu-flash.log 2>&1
echo "rc $?"
grep -E "^  k_dsa|Duration|Compute \(SM\) Throughput|Memory Throughput|Grid Size|Registers|Issue Slots Busy|Executed Ipc A|Stall|Warp Cycles Per Issued|pipe|Pipe" $L/ncu-flash.log | cut -c1-120 | head -120
echo "[$SECONDS] done"
