#!/usr/bin/env bash
# Session 44, call 1: MXFP8 weights expanded by bit placement (M3_GEMM_TC_MXB=1; by default the
# conversions) and half stages (M3_GEMM_TC_HS=1: the x ring in half K blocks, a ring of weight
# slots) checked and timed against the old paths in one binary, MXFP8 at 256 tokens with them; the
# MoE's fat tiles of 320 rows (M3_MOE_TC_FAT320=1: an n256 and an n64 wgmma, half stages); where
# the MoE op's time goes at 4096 tokens (ncu, every kernel); the MoE's 128 / 256 crossing; on an
# H200, the 30-layer dspark bench; memchecks of the half stages.
# usage (after scripts/gpu-bin.sh; docs/logs moved aside; this file in .gpu_pack): END=360 bash .gpu_pack/call1.sh
set -u
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; S=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; W=/tmp/w; mkdir -p $W
END=${END:-360}
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
gmem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
{
# 1. checks: the ragged shapes at the half stages (192 and 256 forced; MXFP8 at 256 too), the MoE's
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_BN=192" "M3_GEMM_TC_BN=256" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=192" "M3_GEMM_TC_HS=1 M3_GEMM_TC_N192=0 M3_GEMM_TC_BN=192" "M3_GEMM_TC_MXB=1" "M3_GEMM_TC_MXB=1 M3_GEMM_TC_BN=192" "M3_GEMM_TC_MXB=1 M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256"; do
  env $v timeout 90 $B/bench_cuda_gemm --ragged > $W/gr.log 2>&1; echo "[$SECONDS] gemm ragged, $v rc $?"; grep FAIL $W/gr.log | head -5; tail -1 $W/gr.log
done
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_HS=1"; do
  env $v timeout 150 $B/bench_cuda_moe --ragged > $W/mr.log 2>&1; echo "[$SECONDS] moe ragged, $v rc $?"; grep -E "FAIL|passed" $W/mr.log | head -5
done
cp $W/mr.log $OUT/
# 2. the GEMM at the M3.1-Flash shapes: default, half stages, half stages with MXFP8 at 256
for shp in "12288 6144" "6144 3072"; do for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_MXB=1" "M3_GEMM_TC_HS=1" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256" "M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256 M3_GEMM_TC_MXB=1"; do
  echo "== [$SECONDS] bench_cuda_gemm $shp, $v"
  env $v timeout 60 $B/bench_cuda_gemm $shp 2>&1 | grep -vE "^device|^format" | grep -E "MXFP8|NVFP4|FAIL|passed"
done; done
# 3. the MoE op, default / half stages, and the 128 / 256 crossing
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_HS=1" "M3_MOE_TC_FAT320=1" "M3_MOE_TC_FAT320=1 M3_GEMM_TC_HS=1" "M3_MOE_TC_BN=128" "M3_MOE_TC_BN=256"; do
  [ $(left) -gt 150 ] || break
  echo "== [$SECONDS] bench_cuda_moe --only 2048,4096, $v"; env $v timeout 60 $B/bench_cuda_moe --only 2048,4096 2>&1 | grep -vE "^device"
done
# 4. 8 layers, 4096-token prefill
i=0
for v in "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_MXB=1" "M3_GEMM_TC_HS=1" "M3_MOE_TC_FAT320=1" "M3_GEMM_TC_MXB=1 M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256" "M3_GEMM_TC_DEFAULT=1" "M3_GEMM_TC_MXB=1 M3_MOE_TC_FAT320=1"; do
  i=$((i+1)); [ $(left) -gt 110 ] || break
  env $v timeout 60 $B/m3 bench --random-weights --config $S --layers 8 --batch 1 --context 8192 --steps 3 --prefill 4096 --profile > $W/pn$i.log 2>&1
  echo "== [$SECONDS] 8 layers, $v rc $?"; grep -E "^prefill|^ +1 +8192" -A2 $W/pn$i.log | cut -c1-330
done
cp $W/pn1.log $W/pn2.log $OUT/ 2>/dev/null
# 5. ncu: every kernel of the MoE op at 4096 tokens
if [ -n "$NCU" ] && [ $(left) -gt 100 ]; then
  timeout 70 $NCU --metrics gpu__time_duration.sum --print-units base --csv $B/bench_cuda_moe --only 4096 > $OUT/ncu-moe4096.csv 2>&1
  echo "[$SECONDS] ncu durations rc $?"
  python3 - $OUT/ncu-moe4096.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
tot = collections.OrderedDict(); n = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    k = r[ki].split("(")[0][:100]; tot[k] = tot.get(k, 0) + v; n[k] += 1
S = sum(tot.values())
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]): print("%10.1f us %5.1f%% %4d x  %s" % (v / 1e3, 100 * v / S, n[k], k))
print("total %.1f us over %d launches" % (S / 1e3, sum(n.values())))
PY
fi
# 6. on an H200: the 30-layer dspark bench (issue 27's acceptance 2)
if [ "${gmem:-0}" -ge 120000 ] && [ $(left) -gt 130 ]; then
  timeout 100 $B/m3 bench --random-weights --config $S --layers 30 --batch 1,8 --context 8192 --steps 10 --prefill 0 --verify 7 \
    --dspark-config $D > $OUT/bench30-dspark.log 2>&1
  echo "[$SECONDS] bench 30 dspark rc $?"
  grep -E "dspark|verify pass of 8|^(1|8) +8192" $OUT/bench30-dspark.log | cut -c1-230
fi
# 7. memchecks of the half stages
CS="compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20"
if [ $(left) -gt 60 ]; then
  M3_GEMM_TC_HS=1 M3_GEMM_TC_BN=256 timeout $(left) $CS $B/bench_cuda_gemm --ragged > $W/cs1.log 2>&1; echo "[$SECONDS] memcheck gemm ragged HS 256 rc $?"; tail -2 $W/cs1.log
fi
if [ $(left) -gt 60 ]; then
  M3_GEMM_TC_HS=1 timeout $(left) $CS $B/bench_cuda_moe --ragged > $W/cs2.log 2>&1; echo "[$SECONDS] memcheck moe ragged HS rc $?"; tail -2 $W/cs2.log
fi
echo "[$SECONDS] done"
} 2>&1 | tee $OUT/call1.log
