#!/usr/bin/env bash
# Session 39, call 1: the prefill attention's token tiles (attention_tile.cu) - bench_cuda_attn (every
# case against the CPU, the three prefill cases and the 64 x 8 verify timed with tiles and without), the
# tile / split logits diffs on the reference checkpoints, memcheck of the tile kernel, and the 8-layer
# 4096-token prefill per op with tiles and without.
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data; W=/tmp/w; mkdir -p $W
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
{
timeout 200 $B/bench_cuda_attn > $OUT/attn.log 2>&1; echo "[$SECONDS] bench_cuda_attn rc $?"
grep -E "FAIL|passed|^(bf16|fp8|nvfp4) " $OUT/attn.log | cut -c1-150
for k in 4 6 7 8; do for kv in bf16 nvfp4; do
  M3_ATTN_TILE=0 M3_BENCH_CASE=$k M3_BENCH_KV=$kv timeout 60 $B/bench_cuda_attn 2>&1 | grep -E "^$kv " | sed 's/^/split: /' | cut -c1-150
  M3_ATTN_TILE_TOKENS=8 M3_BENCH_CASE=$k M3_BENCH_KV=$kv timeout 60 $B/bench_cuda_attn 2>&1 | grep -E "^$kv " | sed 's/^/tile8: /' | cut -c1-150
done; done
echo "[$SECONDS] variants done"
ids300=$(seq 1 300 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')
for m in m3-tiny-q m3-gqa3-q m3-mqa-q; do for k in bf16 fp8 nvfp4; do
  for x in 1 0; do M3_ATTN_TILE=$x $B/m3 logits -m $D/$m --ids "$ids300" --decode 4 --kv-cache-dtype $k --backend cuda -o $W/t-$m-$k-$x.st > $W/l.log 2>&1 || { echo "FAILED logits $m $k $x"; tail -3 $W/l.log; }; done
  $B/logits_diff $W/t-$m-$k-1.st $W/t-$m-$k-0.st --tol 1e-5 2>&1 | tail -1 | sed "s/^/$m $k: /"
done; done
echo "[$SECONDS] logits diffs done"
M3_ATTN_TILE=1 timeout 120 $CS --tool memcheck --error-exitcode 9 $B/m3 logits -m $D/m3-gqa3-q --ids "$ids300" --decode 2 --kv-cache-dtype fp8 --backend cuda -o $W/cs.st > $W/cs.log 2>&1; echo "[$SECONDS] memcheck tile logits rc $?"; tail -2 $W/cs.log
M3_BENCH_CASE=8 M3_BENCH_KV=nvfp4 M3_BENCH_REPS=1 timeout 120 $CS --tool memcheck --error-exitcode 9 $B/bench_cuda_attn > $W/cs2.log 2>&1; echo "[$SECONDS] memcheck attn case 8 rc $?"; tail -2 $W/cs2.log
} 2>&1 | tee $OUT/call1.log
for v in "M3_ATTN_TILE=-1" "M3_ATTN_TILE=0" "M3_ATTN_TILE_TOKENS=8"; do
  left=$((570 - SECONDS)); [ $left -gt 60 ] || break
  env $v timeout $left $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 4096 --steps 2 --prefill 4096 --profile > $W/p.log 2>&1
  echo "== 8 layers prefill 4096, $v rc $?" | tee -a $OUT/call1.log; grep -E "^prefill" -A2 $W/p.log | cut -c1-300 | tee -a $OUT/call1.log
done
