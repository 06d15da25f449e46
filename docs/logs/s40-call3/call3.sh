#!/usr/bin/env bash
# Session 40, call 3: attention at precision bf16 (q, K, V and the probabilities rounded to bf16,
# attn_mma.cuh; the CPU computes the same). The bf16 references remade with the attention's rounding
# (tools/make_bf16gemm_oracles.py) and checked on the CPU (teacher-forced); bench_cuda_attn at both
# precisions against the CPU; the 8-layer 4096-token prefill, per op, bf16 / FP8 KV, the default
# (bf16: one part) against three parts (M3_ATTN_PARTS=3) and tiles for every token (M3_ATTN_TILE_ALL=1).
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call3.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w3; R=$OUT/refs; mkdir -p $W $R
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
{
python3 tools/make_bf16gemm_oracles.py tools/make_m3_oracle.py tests/data $R m3-tiny-q m3-gqa3-q m3-mqa-q > $W/make.log 2>&1
echo "[$SECONDS] references rc $?"; grep -E "case|Error|error" $W/make.log | tail -15
for m in m3-tiny-q m3-gqa3-q m3-mqa-q; do
  timeout 60 $B/oracle_check $B/m3 tests/data/$m $R/$m.bf16gemm.oracle.safetensors --precision bf16 --teacher-forced 1 --work $W > $W/tf-$m.log 2>&1
  echo "[$SECONDS] cpu teacher-forced $m rc $?"; tail -3 $W/tf-$m.log
done
for p in bf16 exact; do M3_BENCH_PRECISION=$p timeout 120 $B/bench_cuda_attn > $W/attn-$p.log 2>&1; echo "[$SECONDS] bench_cuda_attn $p rc $?"
  grep -E "FAIL|passed|^(bf16|fp8|nvfp4) " $W/attn-$p.log | cut -c1-150; done
for kv in bf16 fp8; do for v in "M3_ATTN_PARTS=0" "M3_ATTN_PARTS=3" "M3_ATTN_TILE_ALL=1"; do
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --kv-cache-dtype $kv --profile > $W/p.log 2>&1
  echo "== [$SECONDS] 8 layers $kv KV, $v rc $?"; grep -E "^(1|8) +8192|^prefill" -A2 $W/p.log | grep -v "^--" | cut -c1-300
done; done
} 2>&1 | tee $OUT/call3.log
cp $W/tf-*.log $OUT/ 2>/dev/null; tar -C $W -cJf $OUT/attn-logs.tar.xz attn-bf16.log attn-exact.log make.log
