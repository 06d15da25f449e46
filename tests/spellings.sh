#!/usr/bin/env bash
# The same checkpoint under other config spellings (transformers spelling; a flat text
# config without the VL wrapper) and other layouts must give bit-identical logits.
# usage: spellings.sh M3_BIN CHECKPOINT_DIR WORK_DIR
set -eu
M3=$1; SRC=$2; WORK=$3
mkdir -p "$WORK"
ids=3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4,6,2,6,4,3,3,8,3,2,7,9,5,0,2,8,8,4,1,9,7
"$M3" logits -m "$SRC" --ids $ids --decode 4 -o "$WORK/hub.safetensors" 2>/dev/null
for variant in transformers flat; do
  d="$WORK/$variant"; rm -rf "$d"; mkdir -p "$d"
  ln -s "$(cd "$SRC" && pwd)/model.safetensors" "$d/model.safetensors"
  python3 - "$SRC/config.json" "$d/config.json" "$variant" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); t = c["text_config"]; sac = t.pop("sparse_attention_config")
if sys.argv[3] == "transformers":
    t["layer_types"] = ["minimax_m3_sparse" if f else "full_attention" for f in sac["sparse_attention_freq"]]
    t["mlp_layer_types"] = ["sparse" if f else "dense" for f in t.pop("moe_layer_freq")]
    t["index_n_heads"] = sac["sparse_num_index_heads"]; t["index_head_dim"] = sac["sparse_index_dim"]
    t["index_block_size"] = sac["sparse_block_size"]; t["index_topk_blocks"] = sac["sparse_topk_blocks"]
    t["index_local_blocks"] = sac["sparse_local_block"]
    t["rope_parameters"] = {"rope_type": "default", "rope_theta": t.pop("rope_theta"),
                            "partial_rotary_factor": t.pop("partial_rotary_factor")}
    t.pop("rotary_dim")
    json.dump(c, open(sys.argv[2], "w"), indent=1)
else:
    t["sparse_attention_config"] = sac
    json.dump(t, open(sys.argv[2], "w"), indent=1)
PY
  "$M3" logits -m "$d" --ids $ids --decode 4 -o "$WORK/$variant.safetensors" 2>/dev/null
  if cmp -s "$WORK/hub.safetensors" "$WORK/$variant.safetensors"; then echo "ok   $variant spelling: identical output"
  else echo "FAIL $variant spelling: output differs"; exit 1; fi
done
