#!/usr/bin/env bash
# session 37 call 7: SwiGLU-OAI in the gate + up launch's epilogue at 1-4 tokens (dense MLP, shared
# expert) and for the MoE's slots at one token (M3_GV_SWIGLU=0: a launch of its own after it, as
# before): logits to the bit both ways (exact and bf16; steps of 1, 3, 8 tokens), the references,
# memcheck on a step, 8-layer timings both ways, the 16/30-layer dspark bench.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call7.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
{
python3 scripts/cut-layers.py $S 2 $W/x2.json && $B/m3 make-tiny --out $W/x2 --config $W/x2.json --quant mxfp8-nvfp4 --seed 5 >/dev/null
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')
for p in exact bf16; do
  for m in $W/x2 tests/data/m3-tiny-q; do
    for u in 1 3 8; do
      for r in 1 0; do
        M3_GV_SWIGLU=$r timeout 120 $B/m3 logits -m $m --ids "$ids" --ubatch $u --decode 4 --backend cuda --precision $p -o $W/s-u$u-r$r.st > $W/s.log 2>&1 || { echo "FAILED logits $m u$u r$r"; tail -3 $W/s.log; }
      done
      echo "$p $(basename $m) ubatch $u: $($B/logits_diff $W/s-u$u-r1.st $W/s-u$u-r0.st --tol 1e-9 | tail -3 | tr '\n' ' ')"
    done
  done
done
echo "[$SECONDS] equality done"
for m in m3-tiny m3-tiny-q m3-gqa3-q m3-mqa-q; do
  M3_PRECISION=exact timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.oracle.safetensors --backend cuda --tol 1e-3 --work $W 2>&1 | tail -1 | sed "s/^/$m exact: /"
done
M3_PRECISION=exact timeout 60 $B/oracle_check $B/m3 tests/data/m3-tiny-q tests/data/m3-tiny-q.oracle.safetensors --backend cuda --ubatch 1 --tol 1e-3 --work $W 2>&1 | tail -1 | sed "s/^/m3-tiny-q exact ubatch 1: /"
for m in m3-tiny-q m3-gqa3-q m3-mqa-q; do
  timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.bf16gemm.oracle.safetensors --backend cuda --precision bf16 --tol 1e-1 --median-tol 1e-2 --greedy-tie 0.02 --index-agree 0.99 --max-over 0.01 --work $W 2>&1 | tail -1 | sed "s/^/$m bf16: /"
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 120 $CS --tool memcheck --error-exitcode 9 $B/m3 logits -m $W/x2 --ids "$ids" --ubatch 1 --decode 2 --backend cuda -o $W/cs.st > $W/cs.log 2>&1
echo "[$SECONDS] memcheck rc $? $(grep 'ERROR SUMMARY' $W/cs.log | head -1)"
} 2>&1 | tee $OUT/checks.log
{
for rr in 1 2; do
  for v in 1 0; do
    M3_GV_SWIGLU=$v timeout 150 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $W/b8.log 2>&1
    echo "[$SECONDS] 8 layers M3_GV_SWIGLU=$v round $rr rc $?"
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
cp /tmp/w/bench*-dspark.log $OUT/ 2>/dev/null
