#!/usr/bin/env bash
# session 37 call 2: the fused MoE launch (gate + up, SwiGLU and down in one k_gemv_mma launch;
# M3_MOE_FUSE=0 the separate launches). Checks: the same logits to the bit both ways at the
# M3.1-Flash shapes (2 layers; steps of 1, 3 and 8 tokens + decodes), the references on cuda,
# compute-sanitizer memcheck / racecheck on a fused step; then 8-layer decode / verify timings, both
# ways, two alternating rounds; on an H200 the 30-layer m3 bench --dspark-config (issue 27).
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call2.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
{
python3 scripts/cut-layers.py $S 2 $W/x2.json && $B/m3 make-tiny --out $W/x2 --config $W/x2.json --quant mxfp8-nvfp4 --seed 5 >/dev/null
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%200}')
for u in 1 3 8; do
  for f in 1 0; do
    M3_MOE_FUSE=$f timeout 120 $B/m3 logits -m $W/x2 --ids "$ids" --ubatch $u --decode 4 --backend cuda -o $W/f-u$u-f$f.st > $W/f-u$u-f$f.log 2>&1 || { echo "FAILED logits u$u f$f"; tail -3 $W/f-u$u-f$f.log; }
  done
  $B/logits_diff $W/f-u$u-f1.st $W/f-u$u-f0.st --tol 1e-9 | tail -2
done
echo "[$SECONDS] fuse equality done"
for m in m3-tiny m3-tiny-q m3-gqa3-q m3-mqa-q; do
  timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.oracle.safetensors --backend cuda --tol 1e-3 --work $W 2>&1 | tail -1 | sed "s/^/$m: /"
done
M3_PRECISION=exact timeout 60 $B/oracle_check $B/m3 tests/data/m3-tiny-q tests/data/m3-tiny-q.oracle.safetensors --backend cuda --ubatch 1 --tol 1e-3 --work $W 2>&1 | tail -1 | sed "s/^/m3-tiny-q ubatch 1: /"
echo "[$SECONDS] references done"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  timeout 150 $CS --tool $tool --error-exitcode 9 $B/m3 logits -m $W/x2 --ids "$ids" --ubatch 8 --decode 2 --backend cuda -o $W/cs.st > $W/cs-$tool.log 2>&1
  echo "[$SECONDS] compute-sanitizer $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/cs-$tool.log | head -2 | tr '\n' ' ')"
done
} 2>&1 | tee $OUT/checks.log
{
for r in 1 2; do
  for f in 1 0; do
    M3_MOE_FUSE=$f timeout 150 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $W/b8-f$f-r$r.log 2>&1
    echo "[$SECONDS] 8 layers fuse $f round $r rc $?"
    grep -E "verify pass of 8|^(1|8) +8192" $W/b8-f$f-r$r.log | cut -c1-160
  done
done
L=16; [ "${gmem:-0}" -ge 120000 ] && L=30
left=$((560 - SECONDS))
[ $left -gt 60 ] && timeout $left $B/m3 bench --random-weights --config $S --layers $L --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 --dspark-config $D > $W/bench$L-dspark.log 2>&1
echo "[$SECONDS] bench $L layers dspark rc $?"
grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $W/bench$L-dspark.log | cut -c1-230
} 2>&1 | tee $OUT/bench.log
cat $W/b8-f1-r1.log > $OUT/b8-f1-r1.log; cat $W/bench*-dspark.log > $OUT/dspark.log 2>/dev/null
