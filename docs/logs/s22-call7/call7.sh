#!/usr/bin/env bash
# session 22 call 7: the draft's append: k and v in one linear_n; its block: the q and k norms + RoPE in one
# head_norm_rope_n: the draft at 30 layers (once), gpu.sh section 9
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout 150 scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"; grep -E "FAILED|checks failed|ERROR SUMMARY|copy_n|teacher|greedy drafts" $L/s9.log | head -20; tail -3 $L/s9.log
echo "[$SECONDS] dspark 30 layers (once)"
for r in 1; do
  timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
    --dspark-config $D --profile > $L/bench30-$r.log 2>&1; echo "run $r rc $?"; grep -E "^(1|8) |verify pass|dspark|draft per op" -A1 $L/bench30-$r.log | grep -v "^--"
  save
done
echo "[$SECONDS] done"
