#!/usr/bin/env bash
# session 27 call 6: the attention's bf16 kernel for steps of at most 8 tokens only, the indexer's copies-only
# kernel at every size: gpu-quick.sh (now in exact precision for its checks), bench_cuda_attn against the CPU,
# memcheck on the attention and indexer kernels (1 and 8 x 8 tokens), m3 bench 30 layers batch 1 and 8 with
# the verify of 8: default, M3_ATTN_BF16A=0 (twice each), and both old kernels
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call6/call6.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
C=tests/data/m3.1-flash-shapes.json
timeout 200 scripts/gpu-quick.sh $B /tmp/q > $L/quick.log 2>&1; echo "[$SECONDS] quick rc $?"; grep -E "FAILED|passed|failed|rel L2" $L/quick.log | cut -c1-160 | head -20
save
timeout 120 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "[$SECONDS] attn rc $? $(grep -c FAIL $L/attn.log) FAIL"
grep -E "^bf16|all attention" $L/attn.log
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for cs in 0 2; do for k in k_attn_mma k_index_scores; do
  M3_BENCH_CASE=$cs M3_BENCH_REPS=1 timeout 100 $CS --tool memcheck --kernel-name kns=$k --error-exitcode 99 --print-limit 20 \
    $B/bench_cuda_attn > $L/memcheck-$k-$cs.log 2>&1; echo "[$SECONDS] memcheck $k case $cs rc $? $(grep 'ERROR SUMMARY' $L/memcheck-$k-$cs.log)"
done; done
save
for r in 1 2 3; do for v in new nobf16a old; do
  [ $r = 3 ] && [ $v != old ] && continue
  case $v in new) e="";; nobf16a) e="M3_ATTN_BF16A=0";; old) e="M3_ATTN_BF16A=0 M3_INDEX_CPA=0";; esac
  [ $r = 3 ] || [ $v != old ] || continue
  env $e timeout 100 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 --verify 7 > $L/bench30-$v-r$r.log 2>&1; echo "[$SECONDS] $v rc $?"
  grep -E "^(1|8) |verify pass" $L/bench30-$v-r$r.log | cut -c1-120
done; done
echo "[$SECONDS] done"
