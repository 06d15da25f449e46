#!/usr/bin/env bash
# session 38 call 6: racecheck at the committed tree (the attention pipelining of call 5 reverted) on
# the prefill call 5 ran it on (m3-wide-q, 300 tokens, bf16 cache), with the hazards' details; then the
# same with the f32 attention kernel (M3_ATTN_MMA=0), to tell where any hazard is.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; carry .gpu_pack with this file copied in):
#   bash .gpu_pack/call6.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
ids="$(seq 1 300 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%500}')"
for v in "M3_ATTN_MMA=1" "M3_ATTN_MMA=0"; do
  env $v timeout 150 $CS --tool racecheck --print-limit 12 --error-exitcode 9 $B/m3 logits -m tests/data/m3-wide-q --ids "$ids" --decode 2 --backend cuda -o /tmp/rc.st > $OUT/racecheck-$(echo $v | tr '=' '-').log 2>&1
  echo "[$SECONDS] racecheck $v rc $?"
  grep -E "Race reported|Error|hazard|SUMMARY|in kernel|k_[a-z_0-9]+" $OUT/racecheck-$(echo $v | tr '=' '-').log | sort | uniq -c | sort -rn | head -12 | cut -c1-220
done
