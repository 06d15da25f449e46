#!/usr/bin/env bash
# session 37 call 6: precision bf16's x rounded as the SIMT GEMV / BF16 cuBLAS path load it
# (M3_ROUND_IN_LOAD=0: a k_round_bf16 launch first, as before): logits to the bit both ways (the
# router at 1 and 8 tokens on the M3.1-Flash shapes; m3-tiny's BF16 lm_head through SIMT and
# cuBLAS), the bf16 and exact references, bench_cuda_moe --quick (the SwiGLU epilogues of 41be8e5),
# 8-layer timings both ways and with M3_CUDA_PDL=1; on an H200 the 30-layer dspark bench.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call6.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
{
python3 scripts/cut-layers.py $S 2 $W/x2.json && $B/m3 make-tiny --out $W/x2 --config $W/x2.json --quant mxfp8-nvfp4 --seed 5 >/dev/null
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')
for m in $W/x2 tests/data/m3-tiny tests/data/m3-tiny-q; do
  for u in 1 4 8; do
    for r in 1 0; do
      M3_ROUND_IN_LOAD=$r timeout 120 $B/m3 logits -m $m --ids "$ids" --ubatch $u --decode 4 --backend cuda --precision bf16 -o $W/r-u$u-r$r.st > $W/r.log 2>&1 || { echo "FAILED logits $m u$u r$r"; tail -3 $W/r.log; }
    done
    echo "$(basename $m) ubatch $u: $($B/logits_diff $W/r-u$u-r1.st $W/r-u$u-r0.st --tol 1e-9 | tail -2 | tr '\n' ' ')"
  done
done
echo "[$SECONDS] equality done"
for m in m3-tiny m3-tiny-q m3-gqa3-q m3-mqa-q; do
  M3_PRECISION=exact timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.oracle.safetensors --backend cuda --tol 1e-3 --work $W 2>&1 | tail -1 | sed "s/^/$m exact: /"
done
for m in m3-tiny-q m3-gqa3-q m3-mqa-q; do
  timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.bf16gemm.oracle.safetensors --backend cuda --precision bf16 --tol 1e-1 --median-tol 1e-2 --greedy-tie 0.02 --index-agree 0.99 --max-over 0.01 --work $W 2>&1 | tail -1 | sed "s/^/$m bf16: /"
done
timeout 200 $B/bench_cuda_moe --quick > $W/moe.log 2>&1; echo "[$SECONDS] bench_cuda_moe rc $?"; grep -iE "fail|pass|checked" $W/moe.log | tail -4
} 2>&1 | tee $OUT/checks.log
{
for rr in 1 2; do
  for v in "M3_ROUND_IN_LOAD=1" "M3_ROUND_IN_LOAD=0" "M3_CUDA_PDL=1"; do
    env $v timeout 150 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $W/b8.log 2>&1
    echo "[$SECONDS] 8 layers $v round $rr rc $?"
    grep -E "verify pass of 8|^(1|8) +8192" $W/b8.log | cut -c1-160
  done
done
L=16; [ "${gmem:-0}" -ge 120000 ] && L=30
left=$((540 - SECONDS))
[ $left -gt 60 ] && timeout $left $B/m3 bench --random-weights --config $S --layers $L --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config $D > $W/bench$L-dspark.log 2>&1
echo "[$SECONDS] bench $L layers dspark rc $?"
grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $W/bench$L-dspark.log | cut -c1-230
} 2>&1 | tee $OUT/bench.log
cp $W/moe.log $OUT/moe.log 2>/dev/null
