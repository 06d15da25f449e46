#!/usr/bin/env bash
# session 30 call 1: gpu.sh section 3 alone on the tree of 6d58c18 (session 29's call ran section 1 and the
# A/B, and section 3 ran out of that call's time): every kernel against the CPU, with the general attention /
# indexer paths and the GEMM / MoE variants
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack): bash docs/logs/s30-call1/call1.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
M3_GPU_SECTIONS=3 timeout 560 scripts/gpu.sh $B /tmp/w3 > $L/s3.log 2>&1; echo "[$SECONDS] section 3 rc $?"
grep -E "^## |FAILED|checks failed|all checks" $L/s3.log | cut -c1-200 | head -40
echo "[$SECONDS] done"
