#!/usr/bin/env bash
# session 32 call 2: the sampler's reasoning budget (thinking_token_budget) on the GPU, where plain
# rows are drawn and verified on the device (ops draw_rows / verify_rows / argmax rows):
#   test_spec_engine ... sampled cuda: variants 0-2 (2: a budget of 2 after the prompt's open tag, the
#   third token forced inside a verification) against the GPU target's exact joint (chi-square), no
#   speculation / probabilistic / greedy drafts; then dspark_check (the draft's rows and row ops).
# usage (after scripts/gpu-bin.sh; carry .gpu_pack): bash docs/logs/s32-call2/call2.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin
$B/m3 make-tiny --out /tmp/w/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark > /dev/null 2>&1
timeout 200 $B/test_spec_engine /tmp/w/dsp sampled cuda > $OUT/sampled.log 2>&1
echo "[$SECONDS] test_spec_engine sampled cuda rc $?"; grep -E "^5\.|FAIL|passed|failed" $OUT/sampled.log | cut -c1-260
timeout 60 $B/dspark_check /tmp/w/dsp > $OUT/dspark_check.log 2>&1
echo "[$SECONDS] dspark_check rc $?"; grep -E "FAIL|passed|equal|differ" $OUT/dspark_check.log | head -8 | cut -c1-200
