#!/usr/bin/env bash
# For the next GPU session (written in session 41, whose device time went to failed starts): what idles
# the wgmma GEMM's tensor pipe, and the first candidate. (1) three A buffers in the MXFP8 / NVFP4
# consumers (M3_GEMM_TC_NB=3: two wgmma groups in flight, so a half's expansion hides behind two
# halves of MMAs; compiled here without C7513 or spills, never run) checked and timed against the
# default: bench_cuda_gemm at the MoE / MLP shapes, bench_cuda_moe, the 8-layer prefill; (2) ncu's warp
# states with details for a dense linear and the MoE layer's GEMMs (s41-call2/call3.sh); (3) session
# 40's unrun items: gpu.sh section 3 (bench_cuda_attn at both precisions) and the call-5 memchecks.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; .gpu_pack with this file,
# docs/logs/s41-call2/call3.sh and docs/logs/s40-call5/call5.sh copied in): END=560 bash .gpu_pack/next1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W; END=${END:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
{
# NB 3 is taken for one K slice in tiles of 64 / 128 tokens: at 1024 tokens here (64 / 256 take K
# slices, 4096 takes 192-token tiles), and at 4096 with the tiles forced to 128
for shp in "12288 6144" "6144 3072"; do for v in "M3_GEMM_TC_NB=2" "M3_GEMM_TC_NB=3" "M3_GEMM_TC_BN=128" "M3_GEMM_TC_BN=128 M3_GEMM_TC_NB=3"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $v"
  env $v timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -vE "^device"
done; done
for nb in 2 3; do
  M3_GEMM_TC_NB=$nb timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 2 --prefill 4096 --profile > $W/p$nb.log 2>&1
  echo "== [$SECONDS] 8 layers, M3_GEMM_TC_NB=$nb rc $?"; grep -E "^prefill" -A3 $W/p$nb.log | cut -c1-300
done
for nb in 2 3; do
  echo "== [$SECONDS] bench_cuda_moe, M3_GEMM_TC_NB=$nb"
  M3_GEMM_TC_NB=$nb timeout 100 $B/bench_cuda_moe 2>&1 | grep -vE "^device" | tail -14
done
} 2>&1 | tee $OUT/next1.log
[ $SECONDS -lt $((END - 200)) ] && bash .gpu_pack/call3.sh 2>&1 | tee -a $OUT/next1.log
left=$((END - 120 - SECONDS))
[ $left -gt 60 ] && { M3_GPU_SECTIONS="3" timeout $left scripts/gpu.sh .gpu_bin /tmp/w3 > $OUT/s3.log 2>&1; echo "[$SECONDS] section 3 rc $?" | tee -a $OUT/next1.log; grep -E "FAILED|checks failed" $OUT/s3.log | head | tee -a $OUT/next1.log; }
[ $SECONDS -lt $((END - 100)) ] && OUT=$W bash .gpu_pack/call5.sh 2>&1 | tee -a $OUT/next1.log
echo "[$SECONDS] done" | tee -a $OUT/next1.log
