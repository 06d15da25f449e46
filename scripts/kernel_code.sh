#!/usr/bin/env bash
# Compiles every TREE/src/backend/cuda/*.cu to a cubin (sm_90a machine code) in OUT_DIR with the
# flags of the CMake release build, for scripts/kernel_diff.py to compare two trees' kernels
# (this machine has nvcc and ptxas but no cuobjdump / nvdisasm).
#   scripts/kernel_code.sh TREE OUT_DIR [-jN]
# The flags are CMakeLists.txt's: CMAKE_CUDA_FLAGS (-gencode=arch=compute_90a,code=sm_90a
# -lineinfo), CMAKE_CUDA_FLAGS_RELEASE (-O3), CMAKE_CUDA_STANDARD 17, the m3core include
# directory (src) and definitions (PCRE2_CODE_UNIT_WIDTH=8 UTF8PROC_STATIC M3_HAVE_NCCL
# _GNU_SOURCE), as in build/compile_commands.json; -cubin instead of -c (same ptxas run).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TREE OUT_DIR [-jN]" >&2
  exit 2
fi
tree=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
jobs=${3:--j2}
jobs=${jobs#-j}
nvcc=${NVCC:-nvcc}
command -v "$nvcc" >/dev/null || nvcc=/usr/local/cuda/bin/nvcc
flags=(-gencode=arch=compute_90a,code=sm_90a -lineinfo -O3 -std=c++17 -x cu
       -DM3_HAVE_NCCL -DPCRE2_CODE_UNIT_WIDTH=8 -DUTF8PROC_STATIC -D_GNU_SOURCE
       -I"$tree/src" -isystem=/usr/local/cuda/include)
ls "$tree"/src/backend/cuda/*.cu >/dev/null
printf '%s\n' "$tree"/src/backend/cuda/*.cu |
  xargs -P "$jobs" -I{} sh -c 'f="$1"; shift; b=$(basename "$f" .cu); "$@" -cubin "$f" -o "'"$out"'/$b.cubin" || exit 255' \
    _ {} "$nvcc" "${flags[@]}"
ls "$out"/*.cubin
