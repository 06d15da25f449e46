#!/usr/bin/env bash
# session 20 call 1: batch 256 (repeat, K-slice variants), the DSpark draft per op at 30 layers,
# a fresh server's first and second bursts with the step trace, then gpu.sh sections 3 7 9
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
b256() { timeout 60 env "$@" $B/m3 bench --random-weights --config $C --layers 8 --batch 256 --context 8192 --prefill 0 --steps 10 --profile; }
echo "[$SECONDS] b256"
for v in def1 def2 KS1 KS2 KS4; do
  case $v in def*) e="X=1";; KS*) e="M3_GEMM_TC_KS=${v#KS}";; esac
  b256 $e > $L/b256-$v.log 2>&1; echo "$v rc $? $(grep -E '^256 ' $L/b256-$v.log)"; grep "per step" $L/b256-$v.log | head -1
done
save
echo "[$SECONDS] dspark 30 layers"
timeout 120 $B/m3 bench --random-weights --config $C --layers 30 --batch 1,8 --context 8192 --prefill 0 --steps 10 --verify 7 \
  --dspark-config $D --profile > $L/bench30-dspark.log 2>&1; echo "rc $?"; grep -E "^(1|8) |dspark|per step" $L/bench30-dspark.log
save
echo "[$SECONDS] served, fresh server, step trace"
M3_STEP_TRACE=$L/trace.txt M3_LOAD_LEVELS=64,64 timeout 170 scripts/gpu-serve-load.sh $B /tmp/load /tmp/tok.json > $L/serve.log 2>&1
echo "serve rc $?"; grep -E "^\| *64|warm-up|FAILED" $L/serve.log /tmp/load/serve.log | head; cp /tmp/load/serve.log $L/server.log
save
echo "[$SECONDS] sections 3 7 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="3 9 7" timeout $((585 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s379.log 2>&1
echo "sections rc $?"; grep -E "FAILED|checks failed|passed" $L/s379.log | head -20
echo "[$SECONDS] done"
