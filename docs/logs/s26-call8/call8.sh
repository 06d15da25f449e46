#!/usr/bin/env bash
# session 26 call 8: k_dsa_flash with its TF32 splits by truncation (M3_DSA_TRUNC, default 1) against the
# rounding conversions: SASS size, bench_cuda_attn (against the CPU, times), dspark_check at the draft's shapes,
# m3 bench 30 layers batch 1 and 8
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz
B=.gpu_bin; L=/tmp/logs; W=/tmp/w8; rm -rf $L $W; mkdir -p $L $W
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CUO=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
$CUO -sass $B/bench_cuda_attn > $L/sass.txt 2>&1
python3 - $L/sass.txt <<'PY'
import re, sys, collections
cur = None; cnt = collections.Counter(); ops = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m: cur = m.group(1); continue
    if cur and "k_dsa_flash" in cur:
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m: cnt[cur] += 1; ops[cur][m.group(2).split(".")[0]] += 1
for f, n in cnt.items():
    print(f, n, "instructions;", ", ".join(f"{k} {v}" for k, v in ops[f].most_common(12)))
PY
for t in 0 1; do
  M3_DSA_TRUNC=$t M3_BENCH_CASE=0 timeout 120 $B/bench_cuda_attn > $L/attn-trunc$t.log 2>&1; echo "trunc $t rc $?"
  sed -n '/dspark attention (8/,$p' $L/attn-trunc$t.log
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
grep -E "FAIL|one request|greedy drafts|teacher|probabilistic drafts" $L/dspark-check-flash2.log | cut -c1-260
for t in 1 0; do
  M3_DSA_TRUNC=$t timeout 150 $B/m3 bench --random-weights --config tests/data/m3.1-flash-shapes.json --layers 30 --batch 1,8 --context 8192 --steps 10 \
    --prefill 0 --verify 7 --dspark-config tests/data/m3.1-flash-dspark-shapes.json > $L/bench30-trunc$t.log 2>&1; echo "trunc $t rc $?"
  grep -E "^(1|8) |dspark \(k|whole step \(" $L/bench30-trunc$t.log | cut -c1-200
done
echo "[$SECONDS] done"
