#!/usr/bin/env bash
# Session 47, call 3: the wgmma attention with its chunks walked without divides, the token data in
# registers and O's rescale skipped where no row's max moved (TMA the default), against call 2's binary
# (.gpu_pack/old-attn.xz: bench_cuda_attn); the token tiles (the key tables' count now atomic); the
# m3-mqa shapes (D 64, blocks of 32); FP8 / NVFP4 chunks by bulk copies of their raw rows into raw stages,
# decoded from there (M3_ATTN_WG_QBULK=1, off by default: unchecked); prefill; memcheck; on an H200 issue
# 27's 30-layer dspark bench.
# usage (after scripts/gpu-bin.sh; this file, and optionally old-attn.xz (xz of bc79866's bench_cuda_attn), in
# .gpu_pack; docs/logs and tests/data/m3-wide-q* moved aside): END=400 bash .gpu_pack/call3.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
# call 2's bench_cuda_attn (bc79866, built by gpu-bin.sh there), where the pack has it: the A / B on one card
[ -f .gpu_pack/old-attn.xz ] && xz -dc .gpu_pack/old-attn.xz > /tmp/old_attn && chmod +x /tmp/old_attn
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-400}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
attn() { # binary, env, case, kv[, config]
  env $2 M3_BENCH_CASE=$3 M3_BENCH_KV=${4:-bf16} M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=${REPS:-5} timeout 60 $1 ${5:-$S} > $W/a.log 2>&1
  echo "[$SECONDS] $(basename $1) case $3 kv ${4:-bf16} [$2] ${5:-} rc $?"; grep -E "^(bf16|fp8|nvfp4) |FAIL|passed|rror" $W/a.log | head -4
}
pre() { # env, kv
  env $1 timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 1 --prefill 4096 --kv-cache-dtype ${2:-bf16} --profile > $W/p.log 2>&1
  echo "[$SECONDS] prefill 8 layers kv ${2:-bf16} [$1] rc $?"; grep -E "prefill:|GPU time, 1 steps" $W/p.log | cut -c1-300
}
{
for kv in bf16 fp8 nvfp4; do for k in 6 7 8; do attn $B/bench_cuda_attn M3_ATTN_WG=1 $k $kv; done; done
[ -x /tmp/old_attn ] && for kv in bf16 fp8; do for k in 6 7; do attn /tmp/old_attn M3_ATTN_WG_TMA=1 $k $kv; attn $B/bench_cuda_attn M3_ATTN_WG=1 $k $kv; done; done
for kv in bf16 nvfp4; do for k in 6 7 8; do attn $B/bench_cuda_attn "M3_ATTN_WG=0 M3_ATTN_TILE=1 M3_ATTN_TILE_ALL=1" $k $kv; done; done
for kv in fp8 nvfp4; do for k in 6 7 8; do attn $B/bench_cuda_attn M3_ATTN_WG_QBULK=1 $k $kv; done; done
for kv in bf16 fp8 nvfp4; do for k in 6 7 8; do REPS=1 attn $B/bench_cuda_attn M3_ATTN_TILE=1 $k $kv tests/data/m3-mqa/config.json; done; done
pre M3_ATTN_WG=1 bf16; pre M3_ATTN_WG=1 fp8; pre M3_ATTN_WG_QBULK=1 fp8; pre M3_ATTN_WG=0 bf16
for kv in bf16 nvfp4; do
  [ $(left) -gt 100 ] || break
  M3_ATTN_WG_QBULK=1 M3_BENCH_CASE=7 M3_BENCH_KV=$kv M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=1 timeout 90 compute-sanitizer --tool memcheck $B/bench_cuda_attn $S > $W/mc.log 2>&1
  echo "[$SECONDS] memcheck case 7 kv $kv rc $?"; grep -E "ERROR SUMMARY|passed|FAIL" $W/mc.log | head -3
done
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 160 ]; then
  timeout 150 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"; grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call3.log
