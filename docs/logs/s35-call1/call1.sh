#!/usr/bin/env bash
# session 35 call 1: the pipelined GEMV's ring running on from item to item (a warp's next item's
# first stages requested during its item; M3_GV_XITEM=0: the old way). Checks: bench_cuda_linear
# (every format / shape / token count and the MoE layer against the CPU) both ways; logits at the
# M3.1-Flash shapes (2 layers: a dense and a MoE layer) equal to the bit both ways at steps of 1, 3
# and 8 tokens (per-slot, grouped HL and grouped 5-8 token MoE; xshared MXFP8). Times: bench_cuda_linear's
# GB/s both ways; m3 bench 30 layers batch 1 / 8 with --verify 7 and the draft, alternating.
# usage (after scripts/gpu-bin.sh; carry .gpu_pack with this file copied in): bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=$OUT; S=tests/data/m3.1-flash-shapes.json; DS=tests/data/m3.1-flash-dspark-shapes.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $L/gpu.txt 2>&1
for x in 1 0; do
  M3_GV_XITEM=$x timeout 150 $B/bench_cuda_linear > $L/linear-x$x.log 2>&1; echo "[$SECONDS] bench_cuda_linear xitem=$x rc $?"
  grep -c FAIL $L/linear-x$x.log
done
python3 scripts/cut-layers.py $S 2 /tmp/flash2.json && $B/m3 make-tiny --out /tmp/flash2 --config /tmp/flash2.json --quant mxfp8-nvfp4 --seed 5 >/dev/null 2>&1
echo "[$SECONDS] make-tiny rc $?"
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%2000}')
for u in 1 3 8; do
  for x in 1 0; do
    M3_GV_XITEM=$x timeout 120 $B/m3 logits -m /tmp/flash2 --ids "$ids" --ubatch $u --decode 4 --backend cuda -o /tmp/lg-u$u-x$x.st > $L/logits-u$u-x$x.log 2>&1 || echo "FAILED logits u$u x$x"
  done
  $B/logits_diff /tmp/lg-u$u-x1.st /tmp/lg-u$u-x0.st --tol 1e-9 2>&1 | tail -2 | sed "s/^/ubatch $u: /"
  cmp /tmp/lg-u$u-x1.st /tmp/lg-u$u-x0.st && echo "ubatch $u: files identical"
done
echo "[$SECONDS] logits done"
LY=30; mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mem:-0}" -lt 100000 ] && LY=16 # an 80 GB H100: the 30 layers' 112 GiB do not fit
for r in 1 2; do
  for x in 1 0; do
    left=$((560 - SECONDS)); [ $left -gt 100 ] || break 2
    M3_GV_XITEM=$x timeout 130 $B/m3 bench --random-weights --config $S --layers $LY --batch 1,8 --context 8192 --steps 10 \
      --prefill 0 --verify 7 --dspark-config $DS > $L/bench30-x$x-r$r.log 2>&1; echo "[$SECONDS] bench30 xitem=$x rc $?"
    grep -E "^(1|8) |verify pass|whole step" $L/bench30-x$x-r$r.log | cut -c1-200
  done
done
