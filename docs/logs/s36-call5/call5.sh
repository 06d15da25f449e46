#!/usr/bin/env bash
# session 36 call 5: more bytes in flight per warp for the tensor-core GEMV: m3-ns4 is HEAD's m3
# built with a ring of 4 stages (GP_NS 4 in linear_mma.cu, not committed) against 3. The 8-token
# MoE GEMV runs at ~71% of the copy bandwidth with 2 stages of 2.3 KB in flight per warp; 4 stages
# lost at batch 1 when measured before (2.323 against 2.257 ms, 8 layers). Outputs should be equal to
# the bit. Then, on an H200, the 30-layer DSpark bench (issue 27) once with the default.
# usage (gpu-bin.sh, then the variant copied into .gpu_bin as m3-ns4 and the pack remade; docs/logs
# moved aside; carry .gpu_pack with this file copied in): bash .gpu_pack/call5.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/ab; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
python3 scripts/cut-layers.py $S 2 $W/two.json && $B/m3 make-tiny --out $W/two --config $W/two.json --quant mxfp8-nvfp4 --seed 5 > /dev/null 2>&1
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*7919)%32768}')
for u in 1 3 8; do
  for m in m3 m3-ns4; do
    timeout 60 $B/$m logits -m $W/two --ids "$ids" --ubatch $u --decode 4 --backend cuda -o $W/$m-u$u.st > /dev/null 2>&1 || echo "FAILED: logits $m u $u"
  done
  $B/logits_diff $W/m3-ns4-u$u.st $W/m3-u$u.st --tol 1e-9 2>&1 | tail -1 | sed "s/^/ubatch $u ns4 vs ns3: /"
done
for r in 1 2; do
  for m in m3 m3-ns4; do
    f=$OUT/ab-$m-r$r.log
    timeout 60 $B/$m bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 > $f 2>&1
    echo "$m r$r: $(grep -E '^(1|8) ' $f | awk '{print "b"$1" "$3}' | tr '\n' ' ') verify: $(grep -o 'verify pass of 8 tokens per sequence: [0-9.]* ms' $f | awk '{print $8}' | tr '\n' ' ')"
  done
done
echo "[$SECONDS] A/B done"
if [ "${gmem:-0}" -ge 120000 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 layers rc $?"; grep -E "dspark whole step|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-220
fi
