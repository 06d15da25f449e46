"""Copies a reference file (*.oracle.safetensors) with chosen logits rows scaled, for the test
that oracle_check's end-to-end statistics hold their allowance and no more (e2e_rate.sh).

usage: perturb_ref.py SRC DST CASE WHAT ROWS FACTOR
  WHAT   logits (prompt positions) or greedy_logits (decode steps) of case CASE
  ROWS   comma-separated row indices; each row's values are multiplied by FACTOR
         (factor 1.5: a relative L2 of 1/3 against the unchanged reference, over the 1e-1 bound)
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
    if t is None or t["dtype"] != "F32" or len(t["shape"]) != 2:
        sys.exit(f"perturb_ref.py: no F32 matrix {name} in {src}")
    a, _ = t["data_offsets"]
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
