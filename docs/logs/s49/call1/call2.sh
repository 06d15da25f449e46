#!/usr/bin/env bash
# Session 48, call 2 (run in session 49 as call 1, with the 30-layer bench for an H200 moved after the checks): --moe-act-quant nvfp4 on the GPU: the quantizer against the CPU's bit for bit
# (act_quant_check; one pass in registers now), the MoE op against the CPU's (bench_cuda_linear,
# exact), m3 against the reference with the GPU's allowance, where the one far position of call 1
# comes from (hidden states of the GPU against the CPU's, per layer), its cost; the raw-row bulk
# copies as the default (FP8 / NVFP4 cases, FP8 prefill); then gpu.sh section 1.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack; docs/logs and tests/data/m3-wide-q* moved aside):
#   END=400 bash .gpu_pack/call2.sh   (section 1 gets what is left of END seconds)
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; W=/tmp/w; mkdir -p $W $OUT/act
D=tests/data; R=$D/m3-tiny-q.act-nvfp4.oracle.safetensors
{
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 60 $B/act_quant_check > $OUT/act/aqc.log 2>&1; echo "[$SECONDS] act_quant_check rc $?"; grep -E "FAIL|passed|refused" $OUT/act/aqc.log | tail -4
timeout 120 $B/oracle_check $B/m3 tests/data/m3-tiny-q $R --moe-act-quant nvfp4 --backend cuda --tol 1e-3 --max-over 0.01 --stats 1 --work $W > $OUT/act/oc-cuda.log 2>&1
echo "[$SECONDS] oracle_check act cuda (1e-3, 1% over) rc $?"; grep -E "^case|passed" $OUT/act/oc-cuda.log
# issue 27's acceptance 2 figures (30 layers need an H200's memory)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 150 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
    --dspark-config $D/m3.1-flash-dspark-shapes.json --profile > $OUT/bench30.log 2>&1
  echo "[$SECONDS] dspark 30 layers rc $?"; grep -E "^ *(1|8) +8192|verify|spec|draft|floor|projection" $OUT/bench30.log | cut -c1-240 | head -30
fi
# case 3's prompt: CPU and GPU hidden states per layer
ids=$(python3 -c "
from safetensors.torch import load_file; t=load_file('$R'); print(','.join(str(int(v)) for v in t['case3.input_ids']))")
for be in cpu cuda; do timeout 60 $B/m3 logits -m $D/m3-tiny-q --ids $ids --moe-act-quant nvfp4 --precision exact --backend $be --dump-hidden -o $W/h-$be.st > /dev/null 2>&1; done
python3 - "$W/h-cpu.st" "$W/h-cuda.st" <<'PY'
import sys, torch
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
for k in sorted(a, key=lambda s: (len(s), s)):
    if not (k.startswith("hidden") or k == "logits"): continue
    x, y = a[k].double(), b[k].double()
    r = (x - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-30)
    top = torch.topk(r, min(3, r.numel()))
    print(f"{k}: max rel {r.max():.3g} at pos {int(r.argmax())}, over 1e-4: {int((r > 1e-4).sum())}, top {[(int(i), float(v)) for v, i in zip(top.values, top.indices)]}")
PY
M3_BENCH_ACTQ=1 timeout 200 $B/bench_cuda_linear > $OUT/act/linear.log 2>&1; echo "[$SECONDS] bench_cuda_linear actq rc $?"; grep -A6 "MoE layer" $OUT/act/linear.log; grep FAIL $OUT/act/linear.log | head -3
for a in 0 1; do
  M3_BENCH_ACTQ=$a timeout 100 $B/bench_cuda_moe --only 4096 > $OUT/act/moe-only-$a.log 2>&1; echo "[$SECONDS] bench_cuda_moe --only 4096 actq=$a rc $?"; grep -E "^ *4096|FAIL" $OUT/act/moe-only-$a.log | tail -2
done
for q in none nvfp4; do
  timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1,64 --context 8192 --steps 5 --prefill 4096 --profile --moe-act-quant $q > $W/p.log 2>&1
  echo "[$SECONDS] 8 layers, act quant $q rc $?"; grep -E "prefill:|GPU time|^ *(1|64) +8192" $W/p.log | cut -c1-260
done
for kv in fp8 nvfp4; do for k in 6 7 8; do
  M3_BENCH_CASE=$k M3_BENCH_KV=$kv M3_BENCH_PRECISION=bf16 M3_BENCH_REPS=5 timeout 60 $B/bench_cuda_attn $S > $W/a.log 2>&1
  echo "[$SECONDS] attn case $k kv $kv (raw bulk default) rc $?"; grep -E "^(fp8|nvfp4) |FAIL|passed" $W/a.log | head -2
done; done
timeout 90 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 1 --prefill 4096 --kv-cache-dtype fp8 --profile > $W/p.log 2>&1
echo "[$SECONDS] prefill fp8 rc $?"; grep -E "prefill:|GPU time, 1 steps" $W/p.log | cut -c1-300
} 2>&1 | tee $OUT/call2.log
M3_GPU_SECTIONS=1 timeout $(( ${END:-400} - SECONDS )) scripts/gpu.sh $B /tmp/g1 > $OUT/s1.log 2>&1; echo "[$SECONDS] gpu.sh section 1 rc $?" | tee -a $OUT/call2.log
grep -E "FAIL|checks failed|^## " $OUT/s1.log | tail -12 | tee -a $OUT/call2.log
xz -9 $OUT/s1.log
