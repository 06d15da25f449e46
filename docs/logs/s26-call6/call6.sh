#!/usr/bin/env bash
# session 26 call 6: drawn chains recorded too (draw_rows_dev: each slot's parameters in device memory):
# dspark_check (M3.1-Flash draft shapes and the tiny draft), test_spec_engine section 5 on the GPU (chi-square),
# memcheck of a sampled speculative generate, m3 bench 30 layers batch 1 with / without graphs, served sampled
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; W=/tmp/w6; rm -rf $L $W; mkdir -p $L $W
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
for ck in flash2 dsp; do
  timeout 200 $B/dspark_check $W/$ck > $L/dspark-check-$ck.log 2>&1; echo "[$SECONDS] dspark_check $ck rc $?"
  grep -E "FAIL|one request|greedy drafts|probabilistic drafts" $L/dspark-check-$ck.log | cut -c1-260
done
timeout 150 $B/test_spec_engine $W/dsp sampled cuda > $L/spec-engine.log 2>&1; echo "[$SECONDS] test_spec_engine sampled cuda rc $?"
grep -E "^5\.|FAIL|passed|chi" $L/spec-engine.log | cut -c1-200 | head -12
dids=$(seq -s, 3 40)
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 240 $CS --tool memcheck --error-exitcode 99 --print-limit 20 $B/m3 generate -m $W/flash2 --ids $dids -n 24 --ignore-eos --backend cuda \
  --temperature 0.8 --seed 5 --speculative-config '{"method":"dspark","num_speculative_tokens":7,"draft_sample_method":"probabilistic"}' > $L/gen-memcheck.log 2>&1
echo "[$SECONDS] memcheck sampled generate rc $? $(grep 'ERROR SUMMARY' $L/gen-memcheck.log)"
for run_i in 1 2; do
  $B/m3 generate -m $W/flash2 --ids $dids -n 40 --ignore-eos --temperature 0.8 --seed 3 --backend cuda \
    --speculative-config '{"method":"dspark","num_speculative_tokens":7,"draft_sample_method":"probabilistic"}' > $L/sampled.$run_i 2>$L/sampled.err
done
cmp -s $L/sampled.1 $L/sampled.2 && echo "ok sampled repeatable: $(grep -oE '[0-9]+ verify steps' $L/sampled.err)" || echo "FAILED sampled runs differ"
for g in 1 0; do
  M3_CUDA_GRAPHS=$g timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 1 --context 8192 --steps 10 \
    --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/bench30-g$g.log 2>&1; echo "graphs $g rc $?"
  grep -E "^1 |dspark \(k|whole step|drafts of sampled" $L/bench30-g$g.log | cut -c1-260
done
M3_LOAD_TEMP=0.8 M3_LOAD_TOP_P=0.95 M3_LOAD_LEVELS=1,16 M3_LOAD_SPEC='{"method":"dspark","num_speculative_tokens":7}' \
  timeout 200 scripts/gpu-serve-load.sh $B $W/load-spec-sampled /tmp/tok.json > $L/load-spec-sampled.log 2>&1; echo "[$SECONDS] served sampled rc $?"
grep -E "^\| (1|16) |FAILED|spec_decode_num_(drafts|accepted)" $L/load-spec-sampled.log | cut -c1-200
echo "[$SECONDS] done"
