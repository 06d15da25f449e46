#!/usr/bin/env bash
# session 27 call 3: where the latency-bound kernels of a decode step wait (ncu --set full, one launch each
# at batch 1 and 8, 4 layers, context 8192, graphs off): the indexer's scores + top-k, the router's GEMV,
# the attention and its merge
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call3/call3.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
C=tests/data/m3.1-flash-shapes.json
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in 1 8; do
  for k in k_index_scores_mma k_gemv_simt_splitk k_attn_mma_bf16x3 k_attn_merge_lse; do
    M3_CUDA_GRAPHS=0 timeout 120 $NCU --clock-control none --kernel-name regex:$k --launch-skip 6 --launch-count 1 --set full \
      --import-source no --print-details all $B/m3 bench --random-weights --config $C --layers 4 --batch $b --context 8192 --steps 2 --prefill 0 \
      > $L/ncu-$k-b$b.txt 2>&1; echo "[$SECONDS] $k b$b rc $?"
    grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Grid Size|Block Size|Dynamic Shared" $L/ncu-$k-b$b.txt | head -12
  done
  save
done
# the stall reasons by SASS line of the indexer at batch 1
M3_CUDA_GRAPHS=0 timeout 120 $NCU --clock-control none --kernel-name regex:k_index_scores_mma --launch-skip 6 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
  $B/m3 bench --random-weights --config $C --layers 4 --batch 1 --context 8192 --steps 2 --prefill 0 > $L/ncu-index-sass-b1.csv 2>&1
echo "[$SECONDS] sass rc $? $(wc -l < $L/ncu-index-sass-b1.csv)"
echo "[$SECONDS] done"
