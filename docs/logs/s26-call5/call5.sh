#!/usr/bin/env bash
# session 26 call 5: the draft's block pass and greedy chain recorded in a CUDA graph at one request (the attention's
# positions from the pass's table in device memory): dspark_check at the M3.1-Flash draft shapes (2 target
# layers) and on the tiny draft, memcheck of it, greedy generate with / without graphs (drafts equal:
# the same acceptance), m3 bench 30 layers batch 1 with / without graphs
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; W=/tmp/w4; rm -rf $L $W; mkdir -p $L $W
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
python3 - tests/data/m3.1-flash-shapes.json $W/flash2.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); t = c.get("text_config", c); full = t["num_hidden_layers"]
def cut(o):
    for k, v in list(o.items()):
        if isinstance(v, list) and len(v) == full: o[k] = v[:2]
        elif isinstance(v, dict): cut(v)
cut(t); t["num_hidden_layers"] = 2
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
$B/m3 make-tiny --out $W/flash2 --config $W/flash2.json --quant mxfp8-nvfp4 --seed 5 --with-dspark > $L/mk.log 2>&1; echo "[$SECONDS] make-tiny rc $?"
$B/m3 make-tiny --out $W/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
timeout 200 $B/dspark_check $W/flash2 > $L/dspark-check-flash2.log 2>&1; echo "[$SECONDS] dspark_check flash2 rc $?"
grep -E "FAIL|one request|greedy drafts|teacher" $L/dspark-check-flash2.log | cut -c1-220
timeout 100 $B/dspark_check $W/dsp > $L/dspark-check-dsp.log 2>&1; echo "[$SECONDS] dspark_check dsp rc $?"
grep -E "FAIL|one request|greedy drafts" $L/dspark-check-dsp.log | cut -c1-220
dids=$(seq -s, 3 40)
plain=$($B/m3 generate -m $W/flash2 --ids $dids -n 40 --ignore-eos --backend cuda 2>/dev/null)
for g in 1 0; do
  spec=$(M3_CUDA_GRAPHS=$g $B/m3 generate -m $W/flash2 --ids $dids -n 40 --ignore-eos --backend cuda \
    --speculative-config '{"method":"dspark","num_speculative_tokens":7}' 2>$L/gen-g$g.err)
  [ -n "$plain" ] && [ "$plain" = "$spec" ] && echo "ok graphs $g: greedy tokens equal; $(grep -oE '[0-9]+ verify steps|MAL [0-9.]+|accept[^,;]*' $L/gen-g$g.err | tr '\n' ' ')" || { echo "FAILED graphs $g"; tail -3 $L/gen-g$g.err; }
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 240 $CS --tool memcheck --error-exitcode 99 --print-limit 20 $B/m3 generate -m $W/flash2 --ids $dids -n 24 --ignore-eos --backend cuda \
  --speculative-config '{"method":"dspark","num_speculative_tokens":7}' > $L/gen-memcheck.log 2>&1
echo "[$SECONDS] memcheck generate rc $? $(grep 'ERROR SUMMARY' $L/gen-memcheck.log)"
for g in 1 0; do
  M3_CUDA_GRAPHS=$g timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 1 --context 8192 --steps 10 \
    --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/bench30-g$g.log 2>&1; echo "graphs $g rc $?"
  grep -E "^1 |dspark \(k|whole step" $L/bench30-g$g.log | cut -c1-200
done

echo "[$SECONDS] gpu.sh section 9"
xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
M3_GPU_SECTIONS=9 M3_TOKENIZER=/tmp/tok.json timeout 400 scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1; echo "rc $?"
grep -E "^ok|FAILED|checks failed|^\| (1|16|64) |whole step|one request" $L/s9.log | cut -c1-220
echo "[$SECONDS] done"
