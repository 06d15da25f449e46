#!/usr/bin/env bash
# session 19 call 1: ncu --set full on the MoE GEMMs (decode b256: k_ft_gemm; prefill 4096: k_gemm_tc)
set -u
cd "$(dirname "$0")/.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/smi.txt
# 1. decode b256, one MoE layer (layers 0-2 dense): k_ft_gemm gate/up + down of a timed step
timeout 200 $NCU --set full --import-source no -k regex:k_ft_gemm --launch-skip 4 --launch-count 2 -o /tmp/ft256 \
  $B/m3 bench --random-weights --config $C --layers 4 --batch 256 --context 8192 --steps 2 --prefill 0 > $OUT/ncu-ft256.out 2>&1
echo "ft256 rc $?"
$NCU --import /tmp/ft256.ncu-rep --page details > $OUT/ft256-details.txt 2>&1
$NCU --import /tmp/ft256.ncu-rep --page raw --csv > $OUT/ft256-raw.csv 2>&1
$NCU --import /tmp/ft256.ncu-rep --page source --csv --print-source sass > $OUT/ft256-sass.csv 2>&1
# 2. same at b64 (the kernel at 4 slots an expert, for contrast)
timeout 150 $NCU --set full --import-source no -k regex:k_ft_gemm --launch-skip 4 --launch-count 2 -o /tmp/ft64 \
  $B/m3 bench --random-weights --config $C --layers 4 --batch 64 --context 8192 --steps 2 --prefill 0 > $OUT/ncu-ft64.out 2>&1
echo "ft64 rc $?"
$NCU --import /tmp/ft64.ncu-rep --page details > $OUT/ft64-details.txt 2>&1
$NCU --import /tmp/ft64.ncu-rep --page raw --csv > $OUT/ft64-raw.csv 2>&1
# 3. prefill 4096, one MoE layer: the grouped wgmma GEMMs (mode 1 / 2) and a dense one
timeout 200 $NCU --set full --import-source no -k regex:k_gemm_tc --launch-skip 0 --launch-count 24 -o /tmp/tc4096 \
  $B/m3 bench --random-weights --config $C --layers 4 --batch 1 --context 8192 --steps 1 --prefill 4096 > $OUT/ncu-tc.out 2>&1
echo "tc rc $?"
$NCU --import /tmp/tc4096.ncu-rep --page details > $OUT/tc-details.txt 2>&1
$NCU --import /tmp/tc4096.ncu-rep --page raw --csv > $OUT/tc-raw.csv 2>&1
$NCU --import /tmp/tc4096.ncu-rep --page source --csv --print-source sass > $OUT/tc-sass.csv 2>&1
xz -9 $OUT/*.csv; ls -la $OUT
