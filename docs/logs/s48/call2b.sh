#!/usr/bin/env bash
# Session 48, call 2b (the device time nearly spent): --moe-act-quant nvfp4 on the GPU, the short
# checks of call2.sh only: the quantizer against the CPU's bit for bit, m3 against the reference
# with the GPU's allowance, the GPU's hidden states against the CPU's on case 3, the MoE ragged set.
# usage (after scripts/gpu-bin.sh; this file in .gpu_pack): bash .gpu_pack/call2b.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; W=/tmp/w; mkdir -p $W; D=tests/data; R=$D/m3-tiny-q.act-nvfp4.oracle.safetensors
{
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 $B/act_quant_check > $OUT/aqc.log 2>&1; echo "[$SECONDS] act_quant_check rc $?"; grep -E "FAIL|passed|refused" $OUT/aqc.log | tail -4
timeout 60 $B/oracle_check $B/m3 $D/m3-tiny-q $R --moe-act-quant nvfp4 --backend cuda --tol 1e-3 --max-over 0.01 --stats 1 --work $W > $OUT/oc-cuda.log 2>&1
echo "[$SECONDS] oracle_check act cuda (1e-3, 1% over) rc $?"; grep -E "^case|passed" $OUT/oc-cuda.log
ids=$(python3 -c "
from safetensors.torch import load_file; t=load_file('$R'); print(','.join(str(int(v)) for v in t['case3.input_ids']))")
for be in cpu cuda; do timeout 30 $B/m3 logits -m $D/m3-tiny-q --ids $ids --moe-act-quant nvfp4 --precision exact --backend $be --dump-hidden -o $W/h-$be.st > /dev/null 2>&1; done
python3 - "$W/h-cpu.st" "$W/h-cuda.st" <<'PY'
import sys, torch
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
for k in sorted(a, key=lambda s: (len(s), s)):
    if not (k.startswith("hidden") or k == "logits"): continue
    x, y = a[k].double(), b[k].double()
    r = (x - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-30)
    top = torch.topk(r, min(3, r.numel()))
    print(f"{k}: max rel {r.max():.3g} at pos {int(r.argmax())}, over 1e-4: {int((r > 1e-4).sum())}, top {[(int(i), round(float(v), 6)) for v, i in zip(top.values, top.indices)]}")
PY
M3_BENCH_ACTQ=1 timeout 60 $B/bench_cuda_moe --ragged > $OUT/moe-ragged.log 2>&1; echo "[$SECONDS] bench_cuda_moe --ragged actq rc $?"; grep -E "FAIL|passed" $OUT/moe-ragged.log | tail -2
} 2>&1 | tee $OUT/call2b.log
