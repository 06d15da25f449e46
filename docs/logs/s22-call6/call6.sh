#!/usr/bin/env bash
# session 22 call 6: per-kernel GPU time of the DSpark draft at batch 1 (ncu's hardware timer only,
# clocks and caches left alone, through scripts/gpu-ncu.sh): 6 target layers, one timed step, so
# that the run's last draft pass can be read kernel by kernel (context 512: the setup appends 8 rows at a time) (the analysis is done off the device)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
echo "[$SECONDS] ncu"
timeout 330 scripts/gpu-ncu.sh .gpu_bin $L --layers 6 --batch 1 --context 512 --steps 1 --prefill 0 --verify 7 \
  --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/ncu-table.txt 2>&1
echo "rc $?"; head -40 $L/ncu-table.txt; xz -9 $L/ncu.csv
echo "[$SECONDS] done"
