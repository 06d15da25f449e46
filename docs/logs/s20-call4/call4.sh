#!/usr/bin/env bash
# session 20 call 4 (the committed tree, 15a00ec): issue 25's acceptance numbers (m3 bench at 8
# and 30 layers, gpu.sh section 8) and issue 27's (the DSpark step at 30 layers), bench_cuda_attn
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
echo "[$SECONDS] section 8"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS=8 timeout 200 scripts/gpu.sh $B /tmp/w > $L/s8.log 2>&1; echo "s8 rc $?"; grep -E "^\||FAILED|checks failed" $L/s8.log
save
echo "[$SECONDS] bench 8 layers"
timeout 90 $B/m3 bench --random-weights --config $C --layers 8 --batch 1,8,16,64,256 --context 8192 --prefill 4096 --verify 7 --profile > $L/bench8.log 2>&1
echo "rc $?"; grep -E "^(1|8|16|64|256) |^prefill|verify pass" $L/bench8.log
for r in 2 3; do
  timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 256 --context 8192 --prefill 0 --steps 10 > $L/b256-$r.log 2>&1
  echo "b256 run $r rc $? $(grep -E '^256 ' $L/b256-$r.log)"
done
save
echo "[$SECONDS] bench 30 layers"
timeout 150 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 4096 --steps 10 --verify 7 \
  --dspark-config $D > $L/bench30.log 2>&1; echo "rc $?"; grep -E "^(1|8) |^prefill|dspark|verify pass" $L/bench30.log
save
echo "[$SECONDS] bench_cuda_attn"
timeout 100 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $? $(tail -1 $L/attn.log)"; grep -E "^bf16" $L/attn.log
echo "[$SECONDS] done"
