#!/usr/bin/env bash
# session 20 call 5: greedy output rows as device argmax ids (m3_taps.greedy_n) and the indexer's
# staging threshold: verify(8) at batch 8 / 64, batch 256; gpu.sh sections 1, 8, 9
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 1,8,64,256 --context 8192 --prefill 0 --steps 10 --verify 7 > $L/bench8.log 2>&1
echo "bench rc $?"; grep -E "^(1|8|64|256) |verify pass" $L/bench8.log
save
echo "[$SECONDS] section 8"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS=8 timeout 120 scripts/gpu.sh $B /tmp/w > $L/s8.log 2>&1; echo "s8 rc $?"; grep -E "^\| *(1|16|64|128|256) |FAILED|checks failed" $L/s8.log
save
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS=9 timeout 130 scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1; echo "s9 rc $?"; grep -E "FAILED|checks failed|argmax_rows|greedy drafts|ERROR SUMMARY|^\| *(1|16|64) |spec_decode_(mean|steps)" $L/s9.log | head -20
save
echo "[$SECONDS] section 1"
M3_GPU_SECTIONS=1 timeout $((440 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s1.log 2>&1; echo "s1 rc $?"; grep -E "FAILED|checks failed" $L/s1.log | head
echo "[$SECONDS] done"
