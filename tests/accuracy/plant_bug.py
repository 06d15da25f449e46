"""Copies a checkpoint with one planted bug, for the test that the teacher-forced accuracy
contract (oracle_check --teacher-forced) can fail: a checker that excuses every difference as a
bf16 rounding flip would pass these too.

usage: plant_bug.py SRC_DIR DST_DIR KIND
  expert-scale  the first MoE layer's expert 3: its down projection's NVFP4 global scale x 1.01
                (a wrong scale in one expert: 1% on the tokens routed there)
  rope-pair     layer 0, query head 1: the two rows of its first rotary pair swapped in q_proj
                (one head's RoPE applied to the wrong pair of dimensions; position 0, which
                attends only to itself, is unchanged)
Plain Python (no numpy): the safetensors header is JSON, the tensors are byte ranges."""
import json
import os
import re
import shutil
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1, "I32": 4}


def main():
    src, dst, kind = sys.argv[1:4]
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "model.safetensors" and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    cfg = json.load(open(os.path.join(src, "config.json")))
    tc = cfg.get("text_config", cfg)
    raw = bytearray(open(os.path.join(src, "model.safetensors"), "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    base = 8 + n

    def span(name):
        t = hdr[name]
        a, b = t["data_offsets"]
        return base + a, base + b, t

    if kind == "expert-scale":
        names = sorted(k for k in hdr if re.search(r"\.experts\.3\.w2\.weight_global_scale$", k))
        if not names:
            sys.exit("plant_bug: no NVFP4 expert 3 down projection (…experts.3.w2.weight_global_scale) in " + src)
        a, b, t = span(names[0])
        v = struct.unpack("<f", raw[a:b])[0]
        raw[a:b] = struct.pack("<f", v * 1.01)
        what = names[0]
    elif kind == "rope-pair":
        D, half = tc["head_dim"], tc["rotary_dim"] // 2
        r0, r1 = 1 * D + 0, 1 * D + half  # head 1: rotary dimensions 0 and half form a pair
        what = []
        for suffix in ("weight", "weight_scale_inv"):
            name = next((k for k in hdr if k.endswith("layers.0.self_attn.q_proj." + suffix)), None)
            if name is None:
                continue
            a, b, t = span(name)
            row = SIZES[t["dtype"]] * t["shape"][1]
            x, y = a + r0 * row, a + r1 * row
            raw[x:x + row], raw[y:y + row] = raw[y:y + row], raw[x:x + row]
            what.append(name)
        if not what:
            sys.exit("plant_bug: no layer 0 q_proj in " + src)
        what = ", ".join(what)
    else:
        sys.exit("plant_bug: unknown kind " + kind + " (expert-scale, rope-pair)")
    open(os.path.join(dst, "model.safetensors"), "wb").write(raw)
    print("planted %s in %s: %s" % (kind, dst, what))


if __name__ == "__main__":
    main()
