#!/usr/bin/env bash
# Sets up m3 (Debian packages, release build) and runs the demo: writes a small random
# MiniMax-M3 checkpoint in the real Hugging Face layout (MXFP8 + NVFP4) and generates from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --build-only
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
[ -f demo/m3-demo/config.json ] || build/m3 make-tiny --out demo/m3-demo --quant mxfp8-nvfp4 --seed 1
build/m3 generate -m demo/m3-demo --ids 1,2,3,4,5,6,7,8 -n 32 --temperature 0.8 --top-p 0.95 --seed 7
