#!/usr/bin/env bash
# session 21 call 3 (HEAD's kernels): what bounds the indexer's block scores at decode batch 64
# (ncu on k_index_scores_mma, bench_cuda_attn case 3, and the attention kernel beside it); the
# fused top-k off (M3_CUDA_FUSE=0); the attention's key splits at batch 64 / 256 (M3_ATTN_SPLITS)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn, fused top-k on / off"
M3_BENCH_KV=bf16 timeout 60 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $?"
M3_CUDA_FUSE=0 M3_BENCH_KV=bf16 timeout 60 $B/bench_cuda_attn > $L/attn-fuse0.log 2>&1; echo "rc $?"
grep -E "^bf16" $L/attn.log; grep -E "^bf16" $L/attn-fuse0.log
save
echo "[$SECONDS] attention splits"
for sp in 0 2 4; do
  M3_ATTN_SPLITS=$sp timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 64,256 --context 8192 --prefill 0 --steps 10 --profile > $L/b-sp$sp.log 2>&1
  echo "splits $sp: $(grep -E '^(64|256) ' $L/b-sp$sp.log | awk '{printf "%s %s %s | ", $1, $3, $6}') $(grep -o 'attention [0-9.]* ms' $L/b-sp$sp.log | tr '\n' ' ')"
done
save
echo "[$SECONDS] ncu"
M3_BENCH_CASE=3 M3_BENCH_KV=bf16 M3_BENCH_REPS=3 timeout 200 $NCU --set full --import-source no -k regex:"k_index_scores_mma|k_attn_mma" \
  --launch-skip 2 --launch-count 4 -o /tmp/idx $B/bench_cuda_attn > $L/ncu.out 2>&1
echo "ncu rc $?"; tail -3 $L/ncu.out
$NCU --import /tmp/idx.ncu-rep --page details > $L/idx-details.txt 2>&1
$NCU --import /tmp/idx.ncu-rep --page raw --csv > $L/idx-raw.csv 2>&1
grep -E "k_index|k_attn|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit|Block Limit" $L/idx-details.txt | head -80
echo "[$SECONDS] done"
