#!/usr/bin/env bash
# Per-kernel GPU time of decode steps at the M3.1-Flash shapes, read with Nsight Compute's
# hardware timer (no counters beyond gpu__time_duration, clocks left alone, caches not flushed
# so weights stream from HBM as in a real step and small ops see the warm L2 they see there):
# a table per kernel, then the last forward pass kernel by kernel in launch order.
# usage: scripts/gpu-ncu.sh BIN_DIR OUT_DIR [m3 bench args...]
set -u
cd "$(dirname "$0")/.."
B=${1:?usage: scripts/gpu-ncu.sh BIN_DIR OUT_DIR [bench args]}; O=${2:?}; shift 2
mkdir -p "$O"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
args=${*:---layers 2 --batch 1 --context 8192 --steps 3 --prefill 0}
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
  --csv --print-units base "$B/${M3BIN:-m3}" bench --random-weights --config tests/data/m3.1-flash-shapes.json $args > "$O/ncu.csv" 2> "$O/ncu.err"
echo "ncu exit $?; $(grep -c '"gpu__time_duration.sum"' "$O/ncu.csv") kernel launches"
python3 - "$O/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; i = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
per = collections.defaultdict(dict); name = {}
for r in rows[1:]:
    per[r[i["ID"]]][r[i["Metric Name"]]] = r[i["Metric Value"]].replace(",", ""); name[r[i["ID"]]] = r[i["Kernel Name"]].split("(")[0][:60]
agg = collections.OrderedDict()
for k, m in per.items():
    if "gpu__time_duration.sum" not in m: continue
    key = (name[k], m.get("launch__grid_size", "?"), m.get("launch__block_size", "?"), m.get("launch__registers_per_thread", "?"))
    a = agg.setdefault(key, [0, 0.0]); a[0] += 1; a[1] += float(m["gpu__time_duration.sum"]) / 1e3
tot = sum(v[1] for v in agg.values())
print(f"{'kernel':60s} {'grid':>6s} {'block':>5s} {'regs':>4s} {'count':>5s} {'us_total':>9s} {'us_mean':>8s} {'share':>6s}")
for key, (c, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{key[0]:60s} {key[1]:>6s} {key[2]:>5s} {key[3]:>4s} {c:5d} {us:9.1f} {us/c:8.2f} {100*us/tot:5.1f}%")
print(f"total {tot:.1f} us")
# the last forward pass (from the last embedding launch), kernel by kernel in launch order, and
# its sum (against the step time m3 bench prints: what is not in the sum is between kernels)
ids = sorted((k for k in per if "gpu__time_duration.sum" in per[k]), key=int)
ids = [k for k in ids if not name[k].startswith(("k_rand", "k_fill"))]  # weights built at start-up
emb = [n for n, k in enumerate(ids) if name[k] == "k_embed"]
if emb:
    last = ids[emb[-1]:]
    print(f"\nlast pass, in launch order ({len(last)} kernels):")
    for k in last:
        print(f"  {name[k]:58s} {per[k].get('launch__grid_size', '?'):>6s} {float(per[k]['gpu__time_duration.sum']) / 1e3:9.2f}")
    print(f"  sum {sum(float(per[k]['gpu__time_duration.sum']) for k in last) / 1e3:.1f} us")
PY
# M3_NCU_DETAIL=REGEX: hardware counters (throughput, occupancy, warp stalls) of the first 6
# launches of the kernels matching REGEX in the timed steps
if [ -n "${M3_NCU_DETAIL:-}" ]; then
  "$NCU" --clock-control none --cache-control none -k "regex:$M3_NCU_DETAIL" --launch-skip ${M3_NCU_SKIP:-12} --launch-count 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
    --section SchedulerStats --metrics smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio "$B/${M3BIN:-m3}" bench --random-weights --config tests/data/m3.1-flash-shapes.json $args > "$O/ncu-detail.txt" 2>&1
  grep -E "k_gv|k_gemv|k_index|k_attn|Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|No Eligible|Active Warps Per|Eligible Warps|Mem Busy|Max Bandwidth|Stall|stalled|Block Size|Grid Size|smsp__pcsamp" "$O/ncu-detail.txt" | head -200
fi
