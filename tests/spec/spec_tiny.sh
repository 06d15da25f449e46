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
# the confidence head's threshold verifies fewer drafts and changes no token: drafts verified +
# drafts left unverified = every draft of the run without it, fewer as the threshold rises, none at 1
verified() { sed -n 's/.* verify steps, \([0-9]*\) drafts,.*/\1/p' "$W/gen.err"; }
skipped() { sed -n 's/.*: \([0-9]*\) drafts not verified.*/\1/p' "$W/gen.err"; }
last=""
for t in 0.3 0.6 1; do
  spec=$("$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos \
    --speculative-config "{\"method\":\"dspark\",\"num_speculative_tokens\":5,\"dspark_confidence_threshold\":$t}" 2>"$W/gen.err")
  [ "$plain" = "$spec" ] || { echo "FAIL generate with confidence threshold $t: '$spec' vs '$plain'"; exit 1; }
  v=$(verified); s=$(skipped)
  [ -n "$v" ] && [ -n "$s" ] || { echo "FAIL no draft counts with threshold $t"; cat "$W/gen.err"; exit 1; }
  [ -z "$last" ] || [ "$v" -le "$last" ] || { echo "FAIL threshold $t verifies more drafts ($v) than a lower one ($last)"; exit 1; }
  [ "$t" != 1 ] || [ "$v" -eq 0 ] || { echo "FAIL threshold 1 verified $v drafts"; exit 1; }
  echo "     threshold $t: $v drafts verified, $s not"
  last=$v
done
"$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' 2>"$W/gen.err" >/dev/null
all=$(verified)
[ $((v + s)) -eq "$all" ] || { echo "FAIL threshold 1: $v + $s drafts, $all without a threshold"; exit 1; }
echo "ok   dspark_confidence_threshold: same greedy tokens, fewer drafts verified as it rises ($all without it)"
# vLLM's disable_by_batch_size: one request never exceeds it (null: speculation always on)
for v in 2 null; do
  spec=$("$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos \
    --speculative-config "{\"method\":\"dspark\",\"num_speculative_tokens\":5,\"disable_by_batch_size\":$v}" 2>"$W/gen.err")
  [ "$plain" = "$spec" ] && [ "$(verified)" = "$all" ] || { echo "FAIL disable_by_batch_size $v"; cat "$W/gen.err"; exit 1; }
done
echo "ok   disable_by_batch_size 2 / null: a lone request speculates as without it"
# vLLM's max_model_len of the draft: no drafts once the request's tokens + k would pass it
steps() { sed -n 's/.*), \([0-9]*\) verify steps,.*/\1/p' "$W/gen.err"; }
all_steps=$(steps)
spec=$("$M3" generate -m "$W/q" --ids $ids -n 40 --ignore-eos \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5,"max_model_len":30,"draft_tensor_parallel_size":1}' 2>"$W/gen.err")
s30=$(steps)
[ "$plain" = "$spec" ] && [ -n "$s30" ] && [ "$s30" -gt 0 ] && [ "$s30" -lt "$all_steps" ] \
  || { echo "FAIL max_model_len 30: $s30 verify steps ($all_steps without it)"; cat "$W/gen.err"; exit 1; }
echo "ok   max_model_len 30: same greedy tokens, $s30 verify steps ($all_steps without it)"
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
bad --speculative-config '{"method":"dspark","dspark_confidence_threshold":1.5}'
bad --speculative-config '{"method":"dspark","dspark_confidence_threshold":"high"}'
bad --speculative-config '{"method":"dspark","disable_by_batch_size":1}'
bad --speculative-config '{"method":"dspark","disable_by_batch_size":"8"}'
bad --speculative-config '{"method":"dspark","max_model_len":0}'
bad --speculative-config '{"method":"dspark","draft_tensor_parallel_size":2}'
bad --speculative-config '{"method":"dspark"}' --draft "$W/nowhere"
echo "ok   bad speculative configs and a missing draft fail with a message ($(grep "m3 generate: " "$W/bad.err" | head -c 160))"
"$TEST" "$W/q" "$SECTIONS"
