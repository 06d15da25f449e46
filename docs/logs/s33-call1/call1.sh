#!/usr/bin/env bash
# session 33 call 1: gpu.sh sections 9, 8 and 7 on session 32's final tree (4fdcb16): the reasoning
# budget inside device-side draws and verification (test_spec_engine sampled cuda, variant 2) and the
# rest of section 9, the server under load (8), compute-sanitizer (7).
# usage (after scripts/gpu-bin.sh; tests/data/m3-wide-q* packed into .gpu_pack/wideq.tar.xz and the
# tokenizer into .gpu_pack/tokenizer.json.xz, docs/logs moved aside: 64 MiB): bash .gpu_pack/call1.sh (a copy of this file)
set -u
# run from the repository root (the device tool starts there)
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
tar -C tests/data -xJf .gpu_pack/wideq.tar.xz
for s in 9 8 7; do
  left=$((585 - SECONDS)); [ $left -gt 30 ] || break
  M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS=$s timeout $left scripts/gpu.sh .gpu_bin /tmp/w$s > $OUT/s$s.log 2>&1
  echo "[$SECONDS] section $s rc $?"; grep -E "FAILED|checks failed" $OUT/s$s.log | head -20 | cut -c1-240
done
