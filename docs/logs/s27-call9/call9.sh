#!/usr/bin/env bash
# session 27 call 9: the MoE's shared expert on a side stream (m3_cu_side_begin: its own scratch, x-split
# buffers and GEMV counters; fork / join recorded in the graphs) beside the router and the routed experts,
# at steps of up to 8 tokens: gpu-quick.sh (CPU against GPU, the references), the logits of a 4-layer
# M3.1-Flash-shapes checkpoint with M3_CUDA_SIDE=0 / 1 (graphs on: equal to the bit), graph_regrow,
# memcheck of a generation, dspark_check at the draft's shapes, m3 bench 30 layers side on / off, twice
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call9/call9.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; W=/tmp/w; rm -rf $L $W; mkdir -p $L $W
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
C=tests/data/m3.1-flash-shapes.json
python3 scripts/cut-layers.py $C 4 $W/f4.json
$B/m3 make-tiny --out $W/f4 --config $W/f4.json --quant mxfp8-nvfp4 --seed 5 --with-dspark > $L/mk.log 2>&1; echo "[$SECONDS] make-tiny rc $?"
ids=$(seq 1 40 | awk '{printf "%s%d", (NR>1?",":""), ($1*7919)%150000}')
for s in 0 1; do
  M3_CUDA_SIDE=$s timeout 60 $B/m3 logits -m $W/f4 --ids "$ids" --decode 8 --backend cuda -o $W/side$s.st > $L/logits-side$s.log 2>&1; echo "[$SECONDS] logits side $s rc $?"
done
timeout 60 $B/logits_diff $W/side0.st $W/side1.st --tol 1e-9 > $L/diff.log 2>&1; echo "[$SECONDS] side 0 vs 1 rc $?"; cat $L/diff.log
timeout 60 $B/graph_regrow tests/data/m3-tiny-q > $L/graph_regrow.log 2>&1; echo "[$SECONDS] graph_regrow rc $? $(tail -1 $L/graph_regrow.log | cut -c1-80)"
save
timeout 200 scripts/gpu-quick.sh $B /tmp/q > $L/quick.log 2>&1; echo "[$SECONDS] quick rc $?"; grep -E "FAILED|checks failed" $L/quick.log | head
save
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 60 $CS --tool memcheck --error-exitcode 99 --print-limit 20 $B/m3 generate -m /tmp/q/small --ids 5,6,7,8 -n 12 --ignore-eos --backend cuda \
  > $L/memcheck-gen.log 2>&1; echo "[$SECONDS] memcheck generate rc $? $(grep 'ERROR SUMMARY' $L/memcheck-gen.log)"
timeout 100 $B/dspark_check $W/f4 > $L/dspark-check.log 2>&1; echo "[$SECONDS] dspark_check rc $?"; grep -E "FAIL|one request|^ok" $L/dspark-check.log | cut -c1-200
save
for r in 1 2; do for s in 1 0; do
  M3_CUDA_SIDE=$s timeout 100 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 --verify 7 > $L/bench30-side$s-r$r.log 2>&1; echo "[$SECONDS] side $s rc $?"
  grep -E "^(1|8) |verify pass" $L/bench30-side$s-r$r.log | cut -c1-120
done; done
echo "[$SECONDS] done"
