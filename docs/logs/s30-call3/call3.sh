#!/usr/bin/env bash
# session 30 call 3: lm-evaluation-harness's loglikelihood requests on the GPU (gpu.sh section 8's new
# run): a 6-layer checkpoint at M3.1-Flash shapes served with default flags, tools/bench_loglik.py:
# 32 requests of 4 x 512-token prompts, 8 at once, echo + logprobs 1 + max_tokens 1, against plain
# requests of the same prompts; then the same server with --max-logits-rows 512 (prompt chunks of
# up to 512 rows instead of 64), at 512- and 2,048-token prompts
# usage (after scripts/gpu-bin.sh here; carry .gpu_pack with bin.tar.xz and tokenizer.json.xz):
#   bash docs/logs/s30-call3/call3.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
M3_LOAD_KEEP=1 M3_LOAD_LEVELS=none M3_LOAD_LOGLIK=32,8,4,512 timeout 260 scripts/gpu-serve-load.sh $B /tmp/w/loglik /tmp/tok.json > $L/loglik.log 2>&1
echo "[$SECONDS] loglik rc $?"; grep -E "FAILED|^#|^\||every|failed" $L/loglik.log | cut -c1-200 | head -20
save
port=8732; $B/m3 serve -m /tmp/w/loglik/flash6 --port $port --disable-log-requests --max-logits-rows 512 > $L/serve512.log 2>&1 & pid=$!
python3 -c "
import time, urllib.request
for _ in range(2400):
    try:
        if urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2).status == 200: break
    except Exception: time.sleep(0.25)"
grep -E "^m3 serve: (KV|listening)" $L/serve512.log
timeout $((380 - SECONDS)) python3 tools/bench_loglik.py --base http://127.0.0.1:$port --requests 32 --concurrency 8 --batch 4 --prompt-tokens 512 > $L/loglik512rows.log 2>&1
echo "[$SECONDS] --max-logits-rows 512, 512-token prompts rc $?"; cut -c1-200 $L/loglik512rows.log
save
timeout $((470 - SECONDS)) python3 tools/bench_loglik.py --base http://127.0.0.1:$port --requests 16 --concurrency 8 --batch 2 --prompt-tokens 2048 > $L/loglik2k.log 2>&1
echo "[$SECONDS] --max-logits-rows 512, 2,048-token prompts rc $?"; cut -c1-200 $L/loglik2k.log
kill -TERM $pid; wait $pid
echo "[$SECONDS] done"
