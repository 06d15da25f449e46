#!/usr/bin/env bash
# session 27 call 4: the indexer's copies-only kernel (k_index_scores_mma<KD, true>: 2,048 SASS instructions
# against 11,008) at decode too (M3_INDEX_CPA=2) against the default (only from 2,048 (block, run) CTAs):
# bench_cuda_attn (checks against the CPU, index_us) and m3 bench 30 layers batch 1 and 8 with the verify of 8
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call4/call4.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
C=tests/data/m3.1-flash-shapes.json
for v in 1 2; do
  M3_INDEX_CPA=$v timeout 120 $B/bench_cuda_attn > $L/attn-cpa$v.log 2>&1; echo "[$SECONDS] attn cpa $v rc $? $(grep -c FAIL $L/attn-cpa$v.log) FAIL"
  sed -n '/^ctx\|^  *ctx\|context/,/dspark attention/p' $L/attn-cpa$v.log | head -30
done
save
for r in 1 2; do for v in 1 2; do
  M3_INDEX_CPA=$v timeout 100 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 --verify 7 > $L/bench30-cpa$v-r$r.log 2>&1; echo "[$SECONDS] cpa $v rc $?"
  grep -E "^(1|8) |verify pass" $L/bench30-cpa$v-r$r.log | cut -c1-200
done; done
echo "[$SECONDS] done"
