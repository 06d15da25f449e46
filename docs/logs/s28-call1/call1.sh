#!/usr/bin/env bash
# session 28 (no device lent) -> the next session's first call: the tree of 306d27a and after has not run
# on a GPU: 306d27a's single teardown for init failures, 05ce933's narrowing of the side stream (only when
# the shared expert's three matrices take the tensor-core GEMV), e1b57d2's new gpu.sh lines (section 1: the
# side stream and the bf16-only kernels against the general paths, to the bit; section 3: bench_cuda_attn
# with the general kernels). Session 28's own changes (grammar, server) are host-side and ran in CI.
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s28-call1/call1.sh
# then the served runs of section 9 as docs/logs/s27-call8/call8.sh does (m3 + the tokenizer only).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
M3_GPU_SECTIONS=1 timeout 260 scripts/gpu.sh $B /tmp/w1 > $L/s1.log 2>&1; echo "[$SECONDS] section 1 rc $?"
grep -E "FAILED|checks failed|graph_regrow|graphs, faults|logits_diff|side" $L/s1.log | cut -c1-200 | head -30
save
M3_GPU_SECTIONS=3 timeout $((420 - SECONDS)) scripts/gpu.sh $B /tmp/w3 > $L/s3.log 2>&1; echo "[$SECONDS] section 3 rc $?"
grep -E "FAILED|checks failed|all checks|rel L2|max" $L/s3.log | cut -c1-200 | head -30
# session 28's only kernel change: norm + RoPE + KV store with a bf16-only instantiation (1,384 SASS
# instructions against 2,504, 40 registers against 48; M3_ROPE_BF16A=0 the general kernel): section 1
# checks it to the bit; here its time in the decode step, A/B twice each (30 layers, context 8192)
for k in 1 2; do for v in M3_ROPE_BF16A=1 M3_ROPE_BF16A=0; do
  [ $SECONDS -lt 520 ] || break 2
  env $v timeout 60 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 > $L/ab-$v-$k.log 2>&1; echo "[$SECONDS] $v run $k rc $?"; grep -E "^ *(1|8) |decode" $L/ab-$v-$k.log | head -4
done; done
echo "[$SECONDS] done"
