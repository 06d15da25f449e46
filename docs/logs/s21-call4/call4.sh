#!/usr/bin/env bash
# session 21 call 4: the indexer's queries prefetched into L1 (M3_INDEX_QPF) and the separate top-k
# from 2048 CTAs (M3_INDEX_FUSE_MAX): bench_cuda_attn, m3 bench A/B and issue 25's command,
# memcheck, gpu.sh sections 8 and 1
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CSB=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] bench_cuda_attn: default, QPF 0, fused top-k always"
timeout 90 $B/bench_cuda_attn > $L/attn.log 2>&1; echo "rc $? $(tail -1 $L/attn.log)"
M3_INDEX_QPF=0 M3_BENCH_KV=bf16 timeout 60 $B/bench_cuda_attn > $L/attn-qpf0.log 2>&1
M3_INDEX_FUSE_MAX=100000000 M3_BENCH_KV=bf16 timeout 60 $B/bench_cuda_attn > $L/attn-fused.log 2>&1
for f in attn attn-qpf0 attn-fused; do echo "$f: $(grep -E '^bf16' $L/$f.log | awk '{printf "%sx%s %s | ", $3, $4, $9}')"; done
grep -E "^(fp8|nvfp4)" $L/attn.log | awk '{printf "%s %sx%s %s %s | ", $1, $3, $4, $5, $9}'; echo
save
echo "[$SECONDS] m3 bench A/B"
ab() { timeout 60 env "$@" $B/m3 bench --random-weights --config $C --layers 8 --batch 64,256 --context 8192 --prefill 0 --steps 10 > $L/b.log 2>&1
       echo "$* : $(grep -E '^(64|256) ' $L/b.log | awk '{printf "%s %s %s | ", $1, $3, $6}')"; }
for r in 1 2; do ab M3_X=0; ab M3_INDEX_QPF=0; ab M3_INDEX_FUSE_MAX=100000000; ab M3_INDEX_QPF=0 M3_INDEX_FUSE_MAX=100000000; done
timeout 60 $B/m3 bench --random-weights --config $C --layers 8 --batch 64,256 --context 8192 --prefill 0 --steps 10 --profile > $L/b-prof.log 2>&1
grep -A1 -E "^(64|256) " $L/b-prof.log
echo "[$SECONDS] issue 25's command"
timeout 90 $B/m3 bench --random-weights --config $C --layers 8 --batch 1,8,64,256 --context 8192 --prefill 4096 --verify 7 > $L/bench8.log 2>&1
echo "rc $?"; grep -E "^(1|8|64|256) |^prefill|verify pass" $L/bench8.log
save
echo "[$SECONDS] memcheck"
M3_BENCH_CASE=3 M3_BENCH_KV=bf16 M3_BENCH_REPS=1 timeout 100 $CSB --tool memcheck --error-exitcode 99 --print-limit 20 $B/bench_cuda_attn > $L/cs-mem-3.log 2>&1
echo "memcheck case 3 rc $? $(tail -1 $L/cs-mem-3.log)"
save
echo "[$SECONDS] section 8"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS=8 timeout 120 scripts/gpu.sh $B /tmp/w > $L/s8.log 2>&1; echo "s8 rc $?"; grep -E "^\| *(1|16|64|128|256) |FAILED|checks failed" $L/s8.log
save
echo "[$SECONDS] section 1"
M3_GPU_SECTIONS=1 timeout $((500 - SECONDS)) scripts/gpu.sh $B /tmp/w > $L/s1.log 2>&1; echo "s1 rc $?"; grep -E "FAILED|checks failed" $L/s1.log | head
echo "[$SECONDS] done"
