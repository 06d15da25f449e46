#!/usr/bin/env bash
# Session 44, call 1: session 43 call 3 plus, on an H200, the 30-layer dspark bench. Where the MoE op's
# time goes at 4096 tokens (256-row tiles): every kernel's
# duration (ncu, gpu__time_duration), the first grouped GEMM (gate + up, 256-row tiles) in full
# detail; and the 128 / 256 crossing between 2048 and 4096 tokens (bench_cuda_moe --only).
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; this file in .gpu_pack): END=240 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-240}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
{
if [ "${gmem:-0}" -ge 120000 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 70 $NCU --metrics gpu__time_duration.sum --print-units base --csv $B/bench_cuda_moe --only 4096 > $OUT/ncu-moe4096.csv 2>&1
  echo "[$SECONDS] ncu durations rc $?"
  python3 - $OUT/ncu-moe4096.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ii = h.index("ID")
tot = collections.OrderedDict(); n = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    k = r[ki].split("(")[0][:90]; tot[k] = tot.get(k, 0) + v; n[k] += 1
S = sum(tot.values())
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]): print("%10.1f us %5.1f%% %4d x  %s" % (v / 1e3, 100 * v / S, n[k], k))
print("total %.1f us over %d launches" % (S / 1e3, sum(n.values())))
PY
fi
if [ $(left) -gt 70 ]; then
  for v in "M3_MOE_TC_BN=128" "M3_MOE_TC_BN=256" "M3_MOE_TC_DEFAULT=1"; do
    echo "== [$SECONDS] $v"; env $v timeout 60 $B/bench_cuda_moe --only 2048,2560,3072,3584,4096 2>&1 | grep -vE "^device"
  done
fi
if [ -n "$NCU" ] && [ $(left) -gt 60 ]; then
  timeout $(left) $NCU --set full -k regex:k_gemm_tc --launch-count 1 $B/bench_cuda_moe --only 4096 > $OUT/ncu-moe256-full.txt 2>&1
  echo "[$SECONDS] ncu full rc $?"; grep -E "k_gemm_tc<|Duration|Tensor Cycles Active|Warp Cycles Per Issued|Stall (Wait|Long|Math|Barrier|GMMA|Dispatch|Short)" $OUT/ncu-moe256-full.txt | head -20
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call1.log
