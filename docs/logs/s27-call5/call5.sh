#!/usr/bin/env bash
# session 27 call 5: the attention's bf16 kernel without the other formats' code (k_attn_mma_bf16x3<ND, true>:
# 2,120 SASS instructions against 13,168) and the indexer's copies-only kernel at every size: gpu-quick.sh
# (CPU against GPU, the reference checkpoints), bench_cuda_attn against the CPU (M3_ATTN_BF16A 1 / 0),
# compute-sanitizer memcheck on the attention and indexer kernels, m3 bench 30 layers batch 1 and 8 with the
# verify of 8: the new kernels against M3_ATTN_BF16A=0 M3_INDEX_CPA=0 (the old ones), twice
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s27-call5/call5.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
C=tests/data/m3.1-flash-shapes.json
timeout 200 scripts/gpu-quick.sh $B /tmp/q > $L/quick.log 2>&1; echo "[$SECONDS] quick rc $?"; grep -E "FAILED|^ok|passed|failed" $L/quick.log | head -20; tail -3 $L/quick.log
save
for v in 1 0; do
  M3_ATTN_BF16A=$v timeout 120 $B/bench_cuda_attn > $L/attn-bf16a$v.log 2>&1; echo "[$SECONDS] attn bf16a $v rc $? $(grep -c FAIL $L/attn-bf16a$v.log) FAIL"
  grep -E "^bf16|all attention" $L/attn-bf16a$v.log
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
M3_BENCH_CASE=0 M3_BENCH_REPS=1 timeout 200 $CS --tool memcheck --kernel-name regex:'k_attn|k_index' --error-exitcode 99 --print-limit 20 \
  $B/bench_cuda_attn > $L/attn-memcheck.log 2>&1; echo "[$SECONDS] memcheck rc $? $(grep 'ERROR SUMMARY' $L/attn-memcheck.log)"
save
for r in 1 2; do for v in new old; do
  if [ $v = new ]; then e=""; else e="M3_ATTN_BF16A=0 M3_INDEX_CPA=0"; fi
  env $e timeout 100 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 --verify 7 > $L/bench30-$v-r$r.log 2>&1; echo "[$SECONDS] $v rc $?"
  grep -E "^(1|8) |verify pass" $L/bench30-$v-r$r.log | cut -c1-200
done; done
echo "[$SECONDS] done"
