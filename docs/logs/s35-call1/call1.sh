#!/usr/bin/env bash
# session 35 call 1: the pipelined GEMV's ring running on from item to item (a warp's next item's
# first stages requested during its item: M3_GV_XITEM=1; 0: the old way). Checks: bench_cuda_linear
# (every format / shape / token count and the MoE layer against the CPU) with it; logits at the
# M3.1-Flash shapes (2 layers: a dense and a MoE layer) equal to the bit both ways at steps of 3 and
# 8 tokens (grouped MoE at 1-4 and 5-8 tokens, xshared MXFP8) and 1-token decodes. Times: m3 bench 30
# layers (16 on an 80 GB card) batch 1 / 8 with --verify 7 and the draft, both ways; bench_cuda_linear's GB/s both ways.
# usage (after scripts/gpu-bin.sh; carry .gpu_pack with this file copied in): bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=$OUT; S=tests/data/m3.1-flash-shapes.json; DS=tests/data/m3.1-flash-dspark-shapes.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $L/gpu.txt 2>&1; cat $L/gpu.txt
M3_GV_XITEM=1 timeout 120 $B/bench_cuda_linear > $L/linear-x1.log 2>&1; echo "[$SECONDS] bench_cuda_linear xitem=1 rc $? fails $(grep -c FAIL $L/linear-x1.log)"
python3 scripts/cut-layers.py $S 2 /tmp/flash2.json && $B/m3 make-tiny --out /tmp/flash2 --config /tmp/flash2.json --quant mxfp8-nvfp4 --seed 5 >/dev/null 2>&1
echo "[$SECONDS] make-tiny rc $?"
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%2000}')
for u in 3 8; do
  for x in 1 0; do
    M3_GV_XITEM=$x timeout 100 $B/m3 logits -m /tmp/flash2 --ids "$ids" --ubatch $u --decode 4 --backend cuda -o /tmp/lg-u$u-x$x.st > $L/logits-u$u-x$x.log 2>&1 || echo "FAILED logits u$u x$x"
  done
  $B/logits_diff /tmp/lg-u$u-x1.st /tmp/lg-u$u-x0.st --tol 1e-9 2>&1 | tail -2 | sed "s/^/ubatch $u: /"
  cmp /tmp/lg-u$u-x1.st /tmp/lg-u$u-x0.st && echo "ubatch $u: files identical"
done
echo "[$SECONDS] logits done"
LY=30; mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mem:-0}" -lt 100000 ] && LY=16 # an 80 GB H100: the 30 layers' 112 GiB do not fit
b30() {
  left=$((570 - SECONDS)); [ $left -gt 90 ] || return 1
  M3_GV_XITEM=$1 timeout $((left - 5)) $B/m3 bench --random-weights --config $S --layers $LY --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 --verify 7 --dspark-config $DS > $L/bench$LY-x$1-r$2.log 2>&1; echo "[$SECONDS] bench$LY xitem=$1 rc $?"
  grep -E "^(1|8) |verify pass|whole step" $L/bench$LY-x$1-r$2.log | cut -c1-220
}
b30 1 1; b30 0 1
left=$((570 - SECONDS))
[ $left -gt 100 ] && { M3_GV_XITEM=0 timeout 100 $B/bench_cuda_linear > $L/linear-x0.log 2>&1; echo "[$SECONDS] bench_cuda_linear xitem=0 rc $?"; }
b30 1 2; b30 0 2
exit 0
