#!/usr/bin/env bash
# session 34's plan for the next device call (no device was lent in session 34): gpu.sh sections 4
# and 9 on an H200 (kind nvidia-h200; on an 80 GB H100 gpu.sh runs the 30-layer benches at 16
# layers and says so): m3 bench --random-weights at 30 layers with and without --dspark-config,
# issue 27's acceptance 2 (a speculative step at batch 1 and 8 against decode steps), and the rest
# of section 9. Sections 7 and 8 ran in session 33 (H100), 1-3 in session 32.
# usage (after scripts/gpu-bin.sh; tests/data/m3-wide-q* packed into .gpu_pack/wideq.tar.xz and the
# tokenizer into .gpu_pack/tokenizer.json.xz, docs/logs moved aside: 64 MiB): bash .gpu_pack/call1.sh (a copy of this file)
set -u
# run from the repository root (the device tool starts there)
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
tar -C tests/data -xJf .gpu_pack/wideq.tar.xz
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/gpu.txt 2>&1
for s in 4 9; do
  left=$((585 - SECONDS)); [ $left -gt 30 ] || break
  M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS=$s timeout $left scripts/gpu.sh .gpu_bin /tmp/w$s > $OUT/s$s.log 2>&1
  echo "[$SECONDS] section $s rc $?"; grep -E "FAILED|checks failed" $OUT/s$s.log | head -20 | cut -c1-240
done
