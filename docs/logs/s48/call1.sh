#!/usr/bin/env bash
# Session 48, call 1: the routed experts' FC1 input in NVFP4 per token (--moe-act-quant nvfp4, new):
# its reference made here (tools/make_act_oracle.py, torch on the CPU), m3 against it on the CPU and
# the GPU (exact), the GPU op against the CPU op (bench_cuda_linear's MoE, exact) and against the
# bf16 reference (bench_cuda_moe, every path), its cost at the 8-layer prefill; then session 47's
# call 3 (the wgmma attention's walk, QBULK, prefill, memchecks, on an H200 the 30-layer dspark bench).
# usage (after scripts/gpu-bin.sh; this file and call3.sh in .gpu_pack; docs/logs and
# tests/data/m3-wide-q* moved aside): END=560 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W $OUT/act
{
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 240 python3 tools/make_act_oracle.py $OUT/act > $OUT/act/make.log 2>&1; echo "[$SECONDS] act oracle rc $?"; tail -3 $OUT/act/make.log
R=$OUT/act/m3-tiny-q.act-nvfp4.oracle.safetensors
for be in cpu cuda; do
  timeout 120 $B/oracle_check $B/m3 tests/data/m3-tiny-q $R --moe-act-quant nvfp4 --backend $be --work $W > $OUT/act/oc-$be.log 2>&1
  echo "[$SECONDS] oracle_check act nvfp4 $be rc $?"; tail -4 $OUT/act/oc-$be.log
  timeout 120 $B/oracle_check $B/m3 tests/data/m3-tiny-q $R --backend $be --work $W > $OUT/act/oc-$be-off.log 2>&1
  echo "[$SECONDS] oracle_check without the switch against it (must fail) $be rc $?"; tail -2 $OUT/act/oc-$be-off.log
done
M3_BENCH_ACTQ=1 timeout 120 $B/bench_cuda_linear 512 6144 > $OUT/act/linear.log 2>&1; echo "[$SECONDS] bench_cuda_linear actq rc $?"; grep -iE "moe|FAIL" $OUT/act/linear.log | head -8
M3_BENCH_ACTQ=1 timeout 150 $B/bench_cuda_moe --ragged > $OUT/act/moe-ragged.log 2>&1; echo "[$SECONDS] bench_cuda_moe --ragged actq rc $?"; grep -E "FAIL|passed|fail" $OUT/act/moe-ragged.log | tail -3
for a in 0 1; do
  M3_BENCH_ACTQ=$a timeout 100 $B/bench_cuda_moe --only 64,512,4096 > $OUT/act/moe-only-$a.log 2>&1; echo "[$SECONDS] bench_cuda_moe --only actq=$a rc $?"; grep -E "^T|ms|FAIL" $OUT/act/moe-only-$a.log | tail -6
done
for q in none nvfp4; do
  timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,64 --context 8192 --steps 5 --prefill 4096 --profile --moe-act-quant $q > $W/p.log 2>&1
  echo "[$SECONDS] 8 layers, act quant $q rc $?"; grep -E "prefill:|GPU time|^ *(1|64) +8192" $W/p.log | cut -c1-260
done
} 2>&1 | tee $OUT/call1.log
END=$(( ${END:-560} - SECONDS )) bash .gpu_pack/call3.sh
