"""Copies a reference file (*.oracle.safetensors) with chosen logits rows scaled or greedy tokens
changed, for the tests that oracle_check's end-to-end statistics hold their allowance and no
more, and that --twin lets a device follow the CPU only where the CPU leaves the reference too
(e2e_rate.sh).

usage: perturb_ref.py SRC DST CASE WHAT ROWS FACTOR
  WHAT   logits (prompt positions) or greedy_logits (decode steps) of case CASE: each listed
         row's values multiplied by FACTOR (1.5: a relative L2 of 1/3 against the unchanged
         reference, over the 1e-1 bound); greedy_tokens: each listed step's token id + 1
         (FACTOR unused), a reference whose greedy path no run follows
  ROWS   comma-separated row indices
Plain Python (no numpy): the safetensors header is JSON, the tensors are byte ranges."""
import json
import struct
import sys


def main():
    src, dst, case, what, rows, factor = sys.argv[1:7]
    raw = bytearray(open(src, "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    name = f"case{case}.{what}"
    t = hdr.get(name)
    a = t["data_offsets"][0] if t else 0
    if what == "greedy_tokens":
        if t is None or t["dtype"] != "I32":
            sys.exit(f"perturb_ref.py: no I32 tensor {name} in {src}")
        for r in (int(x) for x in rows.split(",")):
            off = 8 + n + a + 4 * r
            if not 0 <= 4 * r < t["data_offsets"][1] - a:
                sys.exit(f"perturb_ref.py: step {r} outside {name}")
            struct.pack_into("<i", raw, off, struct.unpack_from("<i", raw, off)[0] + 1)
        open(dst, "wb").write(raw)
        return
    if t is None or t["dtype"] != "F32" or len(t["shape"]) != 2:
        sys.exit(f"perturb_ref.py: no F32 matrix {name} in {src}")
    V = t["shape"][1]
    f = float(factor)
    for r in (int(x) for x in rows.split(",")):
        if not 0 <= r < t["shape"][0]:
            sys.exit(f"perturb_ref.py: row {r} outside {name} ({t['shape'][0]} rows)")
        off = 8 + n + a + 4 * V * r
        vals = struct.unpack_from(f"<{V}f", raw, off)
        struct.pack_into(f"<{V}f", raw, off, *(v * f for v in vals))
    open(dst, "wb").write(raw)


main()
