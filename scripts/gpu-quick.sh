#!/usr/bin/env bash
# A short GPU check (about 30 s on an H200) for when device time is scarce: CPU against GPU on a
# 2-layer checkpoint of the medium shapes (MXFP8 + NVFP4 experts through the tensor-core MoE
# path), the reference checkpoints that reach the tensor-core GEMV, then batch-1/8 decode at
# M3.1-Flash shapes (8 and 30 layers) and a per-op profile. scripts/gpu.sh is the full run.
# usage: scripts/gpu-quick.sh BIN_DIR [OUT_DIR]   (BIN_DIR: m3, oracle_check, logits_diff,
# bench_cuda_linear, bench_cuda_attn, vision_check; shared libraries the GPU host lacks may sit in BIN_DIR/lib)
set -u
cd "$(dirname "$0")/.."
B=${1:?usage: scripts/gpu-quick.sh BIN_DIR [OUT_DIR]}; O=${2:-/tmp/m3-gpu-quick}; D=tests/data
export LD_LIBRARY_PATH=$B/lib:${LD_LIBRARY_PATH:-}
mkdir -p "$O"
fails=0
s() { echo "## [$(date +%T)] $*"; }
ck() { "$@" || { echo "FAILED: $*"; fails=$((fails+1)); }; }
s start; nvidia-smi -L
# the GPU's default precision is bf16: the checks against the CPU's exact arithmetic and the exact
# references run in exact precision (as scripts/gpu.sh does), the benchmarks in the default
export M3_PRECISION=exact
ids=$(seq 1 300 | awk '{printf "%s%d", (NR>1?",":""), ($1*7919)%8192}')
"$B/m3" make-tiny --out "$O/small" --config bench/small-gpu-config.json --quant mxfp8-nvfp4 --seed 3 >/dev/null
s "CPU vs GPU, 2-layer medium shapes"
M3_BACKEND=cpu timeout 60 "$B/m3" logits -m "$O/small" --ids "$ids" --decode 6 --dump-index -o "$O/cpu.st" 2>/dev/null
timeout 60 "$B/m3" logits -m "$O/small" --ids "$ids" --decode 6 --dump-index --backend cuda -o "$O/gpu.st" 2>/dev/null
ck timeout 30 "$B/logits_diff" "$O/cpu.st" "$O/gpu.st" --tol 1e-3
s "reference checkpoints"
for m in m3-wide-q m3-tiny-q; do
  ck timeout 60 "$B/oracle_check" "$B/m3" $D/$m $D/$m.oracle.safetensors --backend cuda --tol 1e-3 --work "$O"
done
ck timeout 60 "$B/oracle_check" "$B/m3" $D/m3-tiny $D/m3-tiny.kv-nvfp4.oracle.safetensors --kv nvfp4 --backend cuda --tol 1e-3 --work "$O"
ck timeout 60 "$B/oracle_check" "$B/m3" $D/m3-tiny $D/m3-tiny.kv-fp8.oracle.safetensors --kv fp8 --backend cuda --tol 1e-3 --work "$O"
s "the vision tower on the GPU (m3vl-tiny: vision_tower_out, image_embeds, logits against the reference)"
for v in m3vl-tiny m3vl-heldout m3vl-big; do
  [ -f $D/$v.oracle.safetensors ] || continue
  ck env M3_BACKEND=cuda timeout 120 "$B/vision_check" "$B/m3" $D/$v $D/$v.oracle.safetensors $D/$v.image.png --work "$O"
done
unset M3_PRECISION
s "decode at M3.1-Flash shapes"
ck timeout 60 "$B/m3" bench --random-weights --config $D/m3.1-flash-shapes.json --layers 8 --batch 1,8 --context 8192 --steps 10 --prefill 0
ck timeout 60 "$B/m3" bench --random-weights --config $D/m3.1-flash-shapes.json --layers 8 --batch 1 --context 8192 --steps 5 --prefill 0 --profile
ck timeout 90 "$B/m3" bench --random-weights --config $D/m3.1-flash-shapes.json --layers 30 --batch 1 --context 8192 --steps 10 --prefill 0
s "variants: ops unfused (M3_CUDA_FUSE=0); GEMVs launched early (M3_CUDA_PDL=1); weights through registers, not the cp.async ring (M3_GV_PIPE=0); row-major, not tiled (M3_CUDA_TILE=0)"
for v in M3_CUDA_FUSE=0 M3_CUDA_PDL=1 M3_GV_PIPE=0 M3_CUDA_TILE=0; do
  env $v timeout 60 "$B/m3" bench --random-weights --config $D/m3.1-flash-shapes.json --layers 8 --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 | sed "s/^/$v: /" | grep -v "device\|model"
done
s "linear kernels and one MoE layer against the CPU; KV store, indexer and sparse attention against the CPU"
ck timeout 120 "$B/bench_cuda_linear"
[ -x "$B/bench_cuda_stream" ] && timeout 60 "$B/bench_cuda_stream"
[ -x "$B/bench_cuda_attn" ] && ck env M3_BENCH_QUICK=1 timeout 180 "$B/bench_cuda_attn"
s "MoE one read per slot (M3_MOE_GROUPED=0; grouped by expert is the default): the MoE layer against the CPU, then batch 8 and a verify pass of 8"
ck env M3_MOE_GROUPED=0 timeout 120 "$B/bench_cuda_linear"
for gflag in 0 1; do
  M3_MOE_GROUPED=$gflag timeout 90 "$B/m3" bench --random-weights --config $D/m3.1-flash-shapes.json --layers 8 --batch 1,8 --context 8192 \
    --steps 10 --prefill 0 --verify 7 | sed "s/^/grouped=$gflag: /"
done
s "compute-sanitizer memcheck: prefill + graph-replayed decode on m3-tiny-q and m3-wide-q"
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$CSB" ]; then
  CS="$CSB --tool memcheck --error-exitcode 99 --print-limit 20"
  ck timeout 180 $CS "$B/m3" logits -m $D/m3-tiny-q --ids 1,2,3,4,5,6,7,8,9,10,11,12 --decode 6 --backend cuda -o "$O/cs1.st"
  ck timeout 240 $CS "$B/m3" logits -m $D/m3-wide-q --ids "$(seq 1 300 | awk '{printf "%s%d", (NR>1?",":""), ($1*37)%500}')" \
    --decode 3 --kv-cache-dtype nvfp4 --backend cuda -o "$O/cs2.st"
else
  echo "compute-sanitizer not found"
fi
s "checks failed: $fails"
exit $fails
