#!/usr/bin/env bash
# Bad checkpoints and bad input: each must give a non-zero exit (not a crash) and one
# clear line on stderr that names the problem.
# usage: errors.sh M3_BIN CHECKPOINT_DIR WORK_DIR
set -u
M3=$1; SRC=$2; WORK=$3
mkdir -p "$WORK"
here=$(cd "$(dirname "$0")" && pwd)
fails=0; n=0

expect() { # name, expected substring, command...
  local name=$1 want=$2; shift 2
  n=$((n+1))
  "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$? lines
  lines=$(wc -l <"$WORK/err")
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then
    echo "FAIL $name: exit status $rc (want a clean non-zero exit)"; cat "$WORK/err"; fails=$((fails+1)); return
  fi
  if [ "$lines" -ne 1 ]; then
    echo "FAIL $name: $lines lines on stderr (want one)"; cat "$WORK/err"; fails=$((fails+1)); return
  fi
  if ! grep -qF -- "$want" "$WORK/err"; then
    echo "FAIL $name: message lacks '$want':"; cat "$WORK/err"; fails=$((fails+1)); return
  fi
  echo "ok   $name: $(cat "$WORK/err")"
}

broken() { # kind -> prints dir
  python3 "$here/corrupt.py" "$SRC" "$WORK/$1" "$1" || { echo "corrupt.py failed for $1" >&2; exit 1; }
  echo "$WORK/$1"
}

logits() { "$M3" logits -m "$1" --ids 1,2,3 -o "$WORK/o.safetensors"; }

expect truncated            "outside the data section" logits "$(broken truncated)"
expect tiny-file            "truncated safetensors file" logits "$(broken tiny-file)"
expect header-too-long      "exceeds the file" logits "$(broken header-too-long)"
expect bad-header-json      "bad header JSON" logits "$(broken bad-header-json)"
expect offset-out-of-range  "q_proj.weight': data_offsets" logits "$(broken offset-out-of-range)"
expect overlap              "overlap" logits "$(broken overlap)"
expect size-mismatch        "input_layernorm.weight'" logits "$(broken size-mismatch)"
expect wrong-dtype          "q_proj.weight': dtype I16 not supported" logits "$(broken wrong-dtype)"
expect wrong-shape          "q_proj.weight': expected shape [128, 128], found [64, 256]" logits "$(broken wrong-shape)"
expect missing-tensor       "missing tensor 'language_model.model.layers.0.self_attn.k_norm.weight'" logits "$(broken missing-tensor)"
expect missing-hidden-size  "missing config field 'hidden_size'" logits "$(broken missing-config-hidden_size)"
expect missing-eps          "missing config field 'rms_norm_eps'" logits "$(broken missing-config-rms_norm_eps)"
expect missing-topk-blocks  "missing config field 'sparse_topk_blocks'" logits "$(broken missing-config-sparse_topk_blocks)"
expect missing-moe-freq     "missing config field 'moe_layer_freq'" logits "$(broken missing-config-moe_layer_freq)"
expect bad-config-json      "bad JSON" logits "$(broken bad-config-json)"
expect shard-missing-file   "model-00002-of-00002.safetensors: cannot open" logits "$(broken shard-missing-file)"
expect no-checkpoint        "cannot open config" "$M3" logits -m "$WORK/does-not-exist" --ids 1 -o "$WORK/o.safetensors"
expect id-out-of-range      "token id 5000 at index 1 is out of range (vocab 1024)" "$M3" logits -m "$SRC" --ids 5,5000 -o "$WORK/o.safetensors"
expect bad-ids              "is not a non-negative token id" "$M3" logits -m "$SRC" --ids 5,-3 -o "$WORK/o.safetensors"
expect bad-kv-dtype         "unknown dtype 'int3'" "$M3" logits -m "$SRC" --ids 5 --kv-cache-dtype int3 -o "$WORK/o.safetensors"
expect teacher-missing      "--teacher-forced: $WORK/no-ref.safetensors: cannot open" "$M3" logits -m "$SRC" --ids 5 --teacher-forced "$WORK/no-ref.safetensors" -o "$WORK/o.safetensors"
expect near-ties-exact      "--near-ties counts bf16 rounding near-ties: it needs --precision bf16" "$M3" logits -m "$SRC" --ids 5 --near-ties 8 -o "$WORK/o.safetensors"
expect act-quant-value      "--moe-act-quant 'fp4': none" "$M3" logits -m "$SRC" --ids 5 --moe-act-quant fp4 -o "$WORK/o.safetensors"
expect act-quant-env        "\$M3_MOE_ACT_QUANT 'int4': none" env M3_MOE_ACT_QUANT=int4 "$M3" logits -m "$SRC" --ids 5 -o "$WORK/o.safetensors"
expect generate-id-range    "out of range" "$M3" generate -m "$SRC" --ids 1024 -n 2
expect unknown-option       "unknown option '--bogus'" "$M3" logits --bogus
echo "$((n-fails)) of $n error cases passed"
[ $fails -eq 0 ]
