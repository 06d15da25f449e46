#!/usr/bin/env python3
"""Writes a model config cut to its first N layers (per-layer lists cut too):
   scripts/cut-layers.py CONFIG N OUT   (the GPU scripts' real-shape checkpoints of few layers)"""
import json, sys

c = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
t = c.get("text_config", c)
full = t["num_hidden_layers"]


def cut(o):
    for k, v in list(o.items()):
        if isinstance(v, list) and len(v) == full:
            o[k] = v[:n]
        elif isinstance(v, dict):
            cut(v)


cut(t)
t["num_hidden_layers"] = n
json.dump(c, open(sys.argv[3], "w"), indent=1)
