#!/usr/bin/env bash
# DSpark on a tiny random checkpoint: `m3 make-tiny --with-dspark` writes target + draft (the
# same seed gives the same draft files), `m3 generate` gives the same greedy tokens with and
# without --speculative-config (also with a draft in the bare layout and --draft DIR), bad
# speculative configs fail with a message, then the engine tests (test_spec_engine) run.
# usage: spec_tiny.sh M3_BIN TEST_SPEC_ENGINE_BIN WORK_DIR [SECTIONS: test_spec_engine's, default
# greedy,cache,errors; the m3 make-tiny / generate checks run only when they include greedy]
set -eu
M3=$1; TEST=$2; W=$3; SECTIONS=${4:-greedy,cache,errors}
rm -rf "$W"; mkdir -p "$W"
"$M3" make-tiny --out "$W/q" --seed 7 --quant mxfp8-nvfp4 --with-dspark 2>/dev/null
case "$SECTIONS" in *greedy*) ;; *) exec "$TEST" "$W/q" "$SECTIONS" ;; esac
"$M3" make-tiny --out "$W/q2" --seed 7 --quant mxfp8-nvfp4 --with-dspark 2>/dev/null
"$M3" make-tiny --out "$W/bare" --seed 7 --quant mxfp8-nvfp4 --layout bare --with-dspark 2>/dev/null
cmp "$W/q/dspark/model.safetensors" "$W/q2/dspark/model.safetensors" && cmp "$W/q/dspark/config.json" "$W/q2/dspark/config.json" \
  && echo "ok   same seed, same draft files" || { echo "FAIL make-tiny --with-dspark is not deterministic"; exit 1; }
ids=5,17,300,2,999,41,7,7,7,123,456,789
plain=$("$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos 2>/dev/null)
for k in 1 3 7; do
  for how in "" "--draft $W/bare/dspark"; do
    spec=$("$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos $how \
      --speculative-config "{\"method\":\"dspark\",\"num_speculative_tokens\":$k}" 2>"$W/gen.err")
    [ "$plain" = "$spec" ] || { echo "FAIL generate k $k $how: '$spec' vs '$plain'"; exit 1; }
    grep -q "MAL" "$W/gen.err" || { echo "FAIL generate prints no MAL"; cat "$W/gen.err"; exit 1; }
  done
done
echo "ok   m3 generate: same greedy tokens with --speculative-config (k 1, 3, 7; hub and bare drafts): $(grep MAL "$W/gen.err")"
# tensor parallel (two thread ranks, through the engine): the same tokens with the draft beside the ranks
tp2=$("$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos -tp 2 2>"$W/gen.err") || { echo "FAIL generate -tp 2"; cat "$W/gen.err"; exit 1; }
for k in 2 6; do
  spec=$("$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos -tp 2 \
    --speculative-config "{\"method\":\"dspark\",\"num_speculative_tokens\":$k}" 2>"$W/gen.err")
  [ -n "$tp2" ] && [ "$tp2" = "$spec" ] || { echo "FAIL generate -tp 2 k $k: '$spec' vs '$tp2'"; exit 1; }
done
echo "ok   m3 generate -tp 2: same greedy tokens with --speculative-config (k 2, 6)"
bad() {
  if "$M3" generate -m "$W/q" --ids 1,2 -n 3 "$@" >/dev/null 2>"$W/bad.err"; then echo "FAIL accepted: $*"; exit 1; fi
  grep -q "m3 generate: " "$W/bad.err" || { echo "FAIL no message for: $*"; exit 1; }
}
bad --speculative-config '{"method":"eagle"}'
bad --speculative-config '{"method":"dspark","num_speculative_tokens":0}'
bad --speculative-config '{"method":"dspark","foo":1}'
bad --speculative-config '{"method":"dspark"}' --draft "$W/nowhere"
echo "ok   bad speculative configs and a missing draft fail with a message ($(grep "m3 generate: " "$W/bad.err" | head -c 160))"
"$TEST" "$W/q" "$SECTIONS"
