#!/usr/bin/env bash
# session 24 call 5: the draw kernel's finer radix passes over the first pass's crossing bin alone (gathered
# into global scratch): checks against the CPU, sanitizers, ncu of the same launch as calls 1-3;
# same launch as call 1; the bench at 30 layers (sampled drafts, the verification's draws);
# served sampled requests, alone and speculating
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/load-* /tmp/w /tmp/dsp
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
$B/m3 make-tiny --out /tmp/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
for sm in 1 0; do
  echo "[$SECONDS] dspark_check M3_DRAW_SMEM=$sm"
  M3_DRAW_SMEM=$sm timeout 60 $B/dspark_check /tmp/dsp > $L/dspark_check-smem$sm.log 2>&1; echo "rc $?"
  grep -E "draw_rows|verify_rows|probabilistic|ok:|FAIL" $L/dspark_check-smem$sm.log | cut -c1-200
done
for tool in racecheck synccheck; do
  echo "[$SECONDS] $tool kns=_rows (argmax, draw, verify)"
  timeout 90 $CS --tool $tool --kernel-name kns=_rows --error-exitcode 99 --print-limit 20 $B/dspark_check --ops-only /tmp/dsp \
    > $L/ops-$tool-rows.log 2>&1; echo "$tool rc $?"; grep -E "SUMMARY|FAIL|ok:|Internal" $L/ops-$tool-rows.log | head -4
done
save
echo "[$SECONDS] ncu: one draw_rows launch (32 rows of 200,064), as call 1; the SASS lines with the most stall samples"
timeout 150 $NCU --set full --import-source yes -k regex:k_draw_rows -c 1 -o /tmp/dr -f $B/dspark_check --ops-only /tmp/dsp > $L/ncu-run.log 2>&1
echo "rc $?"
$NCU -i /tmp/dr.ncu-rep --page details > $L/ncu-draw.log 2>&1
grep -E "Duration|Issue Slots|Warp Cycles Per Issued|Achieved Occupancy|Registers Per" $L/ncu-draw.log | head -8
$NCU -i /tmp/dr.ncu-rep --page source --csv --print-source sass > $L/ncu-sass.csv 2>&1; echo "sass rc $? $(wc -l < $L/ncu-sass.csv) lines"
python3 - $L/ncu-sass.csv > $L/ncu-sass-top.txt 2>&1 <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((i for i, r in enumerate(rows) if any('Source' == c for c in r)), None)
if hdr is None: print("no header"); print(rows[:3]); sys.exit()
h = rows[hdr]; print(h)
col = next((i for i, c in enumerate(h) if 'Warp Stall Sampling (All' in c), None)
src = h.index('Source')
data = [r for r in rows[hdr + 1:] if len(r) == len(h)]
def num(x):
    try: return float(x.replace(',', ''))
    except: return 0.0
tot = sum(num(r[col]) for r in data) or 1
for r in sorted(data, key=lambda r: -num(r[col]))[:60]:
    print(f"{100 * num(r[col]) / tot:5.1f}%  {r[0]:>6}  {r[src]}")
PY
head -70 $L/ncu-sass-top.txt | cut -c1-150
save
echo "[$SECONDS] bench 30 layers"
timeout 150 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
  --dspark-config $D > $L/bench30.log 2>&1; echo "rc $?"; grep -E "^(1|8) |dspark drafts of sampled|dspark verification|whole step" $L/bench30.log | cut -c1-260
save
echo "[$SECONDS] served, sampled + speculating, 1 / 16 / 64 streams"
M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,16,64 M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}' \
  timeout 150 scripts/gpu-serve-load.sh $B /tmp/load-ss /tmp/tok.json > $L/load-spec-sampled.log 2>&1
echo "rc $?"; grep -E "^\| |FAILED|serve load|on_device|mean_accepted" $L/load-spec-sampled.log | head -10
save
echo "[$SECONDS] served, sampled, 1 / 64 streams"
M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,64 timeout 110 scripts/gpu-serve-load.sh $B /tmp/load-s /tmp/tok.json \
  > $L/load-sampled.log 2>&1; echo "rc $?"; grep -E "^\| |FAILED|serve load" $L/load-sampled.log | head -5
echo "[$SECONDS] done"
