#!/usr/bin/env bash
# session 26 call 10: the review's mends (the table only for one-request passes, the draw kernel's attribute once a device): gpu.sh section 3's draft
# attention lines (default, M3_DSA_FLASH=0, M3_DSA_TRUNC=0), dspark_check at the draft's shapes, m3 bench 30 layers
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; W=/tmp/w9; rm -rf $L $W; mkdir -p $L $W
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
for v in ""; do
  env $v M3_BENCH_CASE=0 timeout 120 $B/bench_cuda_attn > $L/attn-${v:-default}.log 2>&1; echo "${v:-default} rc $?"
  sed -n '/dspark attention (8/,$p' $L/attn-${v:-default}.log
done
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
$B/m3 make-tiny --out $W/flash2 --config $W/flash2.json --quant mxfp8-nvfp4 --seed 5 --with-dspark > $L/mk.log 2>&1
timeout 200 $B/dspark_check $W/flash2 > $L/dspark-check-flash2.log 2>&1; echo "[$SECONDS] dspark_check flash2 rc $?"
grep -E "FAIL|one request|greedy drafts|draw_rows|verify_rows|probabilistic drafts" $L/dspark-check-flash2.log | cut -c1-260
timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 1,8 --context 8192 --steps 10 \
  --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/bench30.log 2>&1; echo "bench rc $?"
grep -E "^(1|8) |dspark \(k|whole step|drafts of sampled" $L/bench30.log | cut -c1-240
echo "[$SECONDS] done"
