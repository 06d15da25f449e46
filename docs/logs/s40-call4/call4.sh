#!/usr/bin/env bash
# Session 40, call 4: the bf16 references remade (attention at bf16) and put in place of the repository's,
# bench_cuda_attn at precision bf16 (k_attn_f32_g16 at bf16 for one-token FP8 / NVFP4 steps), gpu.sh
# section 1 on them, and the 8-layer bench: decode 1 / 8 and the 4096-token prefill, bf16 and FP8 KV.
# usage (after scripts/gpu-bin.sh, this file copied into .gpu_pack): bash .gpu_pack/call4.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w4; R=/tmp/refs4; mkdir -p $W $R
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
{
python3 tools/make_bf16gemm_oracles.py tools/make_m3_oracle.py tests/data $R m3-tiny-q m3-gqa3-q m3-mqa-q > $W/make.log 2>&1
echo "[$SECONDS] references rc $?"; tar -C $R -cJf $OUT/refs.tar.xz . ; cp $R/* tests/data/
for m in m3-tiny-q m3-gqa3-q m3-mqa-q; do
  timeout 60 $B/oracle_check $B/m3 tests/data/$m tests/data/$m.bf16gemm.oracle.safetensors --precision bf16 --teacher-forced 1 --work $W > $W/tf-$m.log 2>&1
  echo "[$SECONDS] cpu teacher-forced $m rc $?"; grep -E "FAIL|passed|MORE|error" $W/tf-$m.log | head -5
done
M3_BENCH_PRECISION=bf16 timeout 120 $B/bench_cuda_attn > $W/attn-bf16.log 2>&1; echo "[$SECONDS] bench_cuda_attn bf16 rc $?"
grep -E "FAIL|passed|^(bf16|fp8|nvfp4) " $W/attn-bf16.log | cut -c1-150
} 2>&1 | tee $OUT/call4.log
M3_GPU_SECTIONS=1 timeout 300 scripts/gpu.sh .gpu_bin /tmp/w1 > $OUT/s1.log 2>&1
echo "[$SECONDS] section 1 rc $?" | tee -a $OUT/call4.log; grep -E "FAILED|checks failed" $OUT/s1.log | head -20 | tee -a $OUT/call4.log
{
for kv in bf16 fp8; do for v in "M3_ATTN_PARTS=0" "M3_ATTN_PARTS=3"; do
  [ $SECONDS -lt 540 ] || break 2
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,8 --context 8192 --steps 3 --prefill 4096 --kv-cache-dtype $kv --profile > $W/p.log 2>&1
  echo "== [$SECONDS] 8 layers $kv KV, $v rc $?"; grep -E "^(1|8) +8192|^prefill" -A2 $W/p.log | grep -v "^--" | cut -c1-300
done; done
} 2>&1 | tee -a $OUT/call4.log
cp $W/tf-*.log $OUT/ 2>/dev/null
