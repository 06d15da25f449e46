"""Makes a broken copy of a checkpoint for the error tests.
usage: corrupt.py SRC_DIR DST_DIR KIND
The copy shares nothing with SRC_DIR; each KIND breaks one thing the loader must catch."""
import json, os, shutil, struct, sys

src, dst, kind = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst)
shutil.copy(os.path.join(src, "config.json"), dst)
st = os.path.join(dst, "model.safetensors")
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = raw[8 + n:]
P = "language_model.model.layers.0."

def write(h, d=None):
    b = json.dumps(h).encode()
    b += b" " * ((8 - len(b) % 8) % 8)
    open(st, "wb").write(struct.pack("<Q", len(b)) + b + (data if d is None else d))

if kind == "truncated":
    open(st, "wb").write(raw[: 8 + n + len(data) // 2])
elif kind == "tiny-file":
    open(st, "wb").write(raw[:5])
elif kind == "header-too-long":
    open(st, "wb").write(struct.pack("<Q", len(raw) * 4) + raw[8:])
elif kind == "bad-header-json":
    open(st, "wb").write(struct.pack("<Q", 16) + b"{not json here!}" + data)
elif kind == "offset-out-of-range":
    t = hdr[P + "self_attn.q_proj.weight"]
    t["data_offsets"] = [len(data) - 8, len(data) - 8 + (t["data_offsets"][1] - t["data_offsets"][0])]
    write(hdr)
elif kind == "overlap":
    a, b = hdr[P + "self_attn.k_proj.weight"], hdr[P + "self_attn.v_proj.weight"]
    b["data_offsets"] = [a["data_offsets"][0] + 2, a["data_offsets"][1] + 2]
    write(hdr)
elif kind == "size-mismatch":
    hdr[P + "input_layernorm.weight"]["shape"] = [hdr[P + "input_layernorm.weight"]["shape"][0] * 2]
    write(hdr)
elif kind == "wrong-dtype":
    hdr[P + "self_attn.q_proj.weight"]["dtype"] = "I16"
    write(hdr)
elif kind == "wrong-shape":
    s = hdr[P + "self_attn.q_proj.weight"]["shape"]
    hdr[P + "self_attn.q_proj.weight"]["shape"] = [s[0] // 2, s[1] * 2]
    write(hdr)
elif kind == "missing-tensor":
    hdr["unused.k_norm.weight"] = hdr.pop(P + "self_attn.k_norm.weight")
    write(hdr)
elif kind.startswith("missing-config-"):
    field = kind[len("missing-config-"):]
    c = json.load(open(os.path.join(src, "config.json")))
    tc = c.get("text_config", c)
    if field in tc: del tc[field]
    elif field in tc.get("sparse_attention_config", {}): del tc["sparse_attention_config"][field]
    else: sys.exit("no field " + field)
    json.dump(c, open(os.path.join(dst, "config.json"), "w"))
    write(hdr)
elif kind == "bad-config-json":
    open(os.path.join(dst, "config.json"), "w").write('{"text_config": {"hidden_size": 128,')
    write(hdr)
elif kind == "shard-missing-file":
    write_to = os.path.join(dst, "model-00001-of-00002.safetensors")
    b = json.dumps(hdr).encode()
    b += b" " * ((8 - len(b) % 8) % 8)
    open(write_to, "wb").write(struct.pack("<Q", len(b)) + b + data)
    wm = {k: "model-00001-of-00002.safetensors" for k in hdr if k != "__metadata__"}
    wm["language_model.lm_head.weight"] = "model-00002-of-00002.safetensors"
    json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(dst, "model.safetensors.index.json"), "w"))
else:
    sys.exit("unknown kind " + kind)
