#!/usr/bin/env bash
# m3 make-tiny writes checkpoints the loader accepts in every format and layout, and the
# spellings agree: hub vs bare names, one file vs shards, compressed-tensors vs ModelOpt
# NVFP4 give bit-identical logits; the same seed gives the same files.
# usage: make_tiny.sh M3_BIN WORK_DIR
set -eu
M3=$1; W=$2
rm -rf "$W"; mkdir -p "$W"
ids=5,17,300,2,999,41,7,7,7,123,456,789,0,1,2,3,4,5,6,8,9,10,11,12,13,14,15,16,18,19,20,21,22,23,24,25,26,27,28,29,30
run() { "$M3" logits -m "$1" --ids $ids --decode 6 --dump-index -o "$2" 2>/dev/null; }
same() { if cmp -s "$1" "$2"; then echo "ok   $3"; else echo "FAIL $3"; exit 1; fi; }

"$M3" make-tiny --out "$W/bf16" --seed 3 --quant none
"$M3" make-tiny --out "$W/q" --seed 3 --quant mxfp8-nvfp4
"$M3" make-tiny --out "$W/q-again" --seed 3 --quant mxfp8-nvfp4
"$M3" make-tiny --out "$W/q-bare" --seed 3 --quant mxfp8-nvfp4 --layout bare
"$M3" make-tiny --out "$W/q-shard" --seed 3 --quant mxfp8-nvfp4 --shard-mb 1
"$M3" make-tiny --out "$W/q-modelopt" --seed 3 --quant mxfp8-nvfp4-modelopt
"$M3" make-tiny --out "$W/other-seed" --seed 4 --quant mxfp8-nvfp4
[ -f "$W/q-shard/model.safetensors.index.json" ] && ls "$W/q-shard"/model-0000*-of-*.safetensors >/dev/null \
  || { echo "FAIL --shard-mb wrote no shards"; exit 1; }
same "$W/q/model.safetensors" "$W/q-again/model.safetensors" "same seed, same file"
for d in bf16 q q-bare q-shard q-modelopt other-seed; do run "$W/$d" "$W/$d.out"; done
same "$W/q.out" "$W/q-bare.out" "bare model.* names give the same logits"
same "$W/q.out" "$W/q-shard.out" "sharded checkpoint gives the same logits"
same "$W/q.out" "$W/q-modelopt.out" "ModelOpt NVFP4 spelling gives the same logits"
if cmp -s "$W/q.out" "$W/other-seed.out"; then echo "FAIL other seed gives the same logits"; exit 1; fi
if cmp -s "$W/q.out" "$W/bf16.out"; then echo "FAIL quantized equals bf16"; exit 1; fi
echo "ok   other seed / quantization differ"
# a config in the hub layout with other shapes (GQA 3, head 48, local blocks 2)
"$M3" make-tiny --out "$W/gqa" --config "$(dirname "$0")/data/m3-gqa3-q/config.json" --seed 5 --quant mxfp8-nvfp4
"$M3" logits -m "$W/gqa" --ids 1,2,3,400,500,600,700,776 --decode 3 -o "$W/gqa.out" 2>/dev/null && echo "ok   --config with other shapes loads and runs"
