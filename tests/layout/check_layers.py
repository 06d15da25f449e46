#!/usr/bin/env python3
"""The source tree's layers, lowest first, and the rule: every #include "..." in src/ points to
its own folder or to a lower layer (never up, never across to a sibling of the same rank).
This list is the one place the order is written; the README's layout section follows it.

  python3 tests/layout/check_layers.py [SRC_DIR]      checks the tree (exit 1 on a violation)
  python3 tests/layout/check_layers.py --self-test    plants an upward and a sideways include
                                                      in a copy of src/ and expects both caught
"""
import os
import re
import shutil
import sys
import tempfile

# (folder under src/, rank): a file may include files of its own folder or of a lower rank
LAYERS = [
    ("base", 0),          # errors, numbers, threads, clocks, strings, hashing, SIMD rows, fault injection
    ("io", 1),            # config.json, safetensors, JSON output
    ("image", 2),         # image decoding and the vision preprocessing
    ("tokenizer", 2),     # tokenizer.json, BPE encode / decode
    ("jinja", 2),         # the chat-template language
    ("weights", 2),       # weight formats, the linear descriptor, checkpoint views
    ("kv", 2),            # KV cache pages, row layouts, prefix blocks
    ("grammar", 2),       # structured outputs: JSON Schema -> automaton, token masks
    ("chat", 3),          # chat templates applied, output parsers (reasoning, tool calls)
    ("backend", 4),       # the op table and its plain compositions
    ("backend/cpu", 5),   # the CPU backend
    ("backend/cuda", 5),  # the CUDA backend
    ("parallel", 6),      # communicators, sharded weight views
    ("model", 7),         # the forward pass, DSpark draft, vision tower, TP groups, random checkpoints
    ("engine", 8),        # scheduler, sampler, speculative decoding
    ("server", 9),        # HTTP, OpenAI API
    ("cli", 10),          # the m3 command
]
RANK = dict(LAYERS)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".c", ".h", ".cu", ".cuh")


def layer_of(rel):
    """the folder (a key of RANK) a path under src/ belongs to, the longest match"""
    d = os.path.dirname(rel)
    while d and d not in RANK:
        d = os.path.dirname(d)
    return d or None


def check(src):
    bad = []
    seen = 0
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(SOURCES):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)
            me = layer_of(rel)
            if me is None:
                bad.append(f"{rel}: in no layer (add its folder to LAYERS in {__file__})")
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for m in INCLUDE.finditer(text):
                target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
                if not os.path.exists(target):
                    continue  # a system or generated header: the compiler says if it is missing
                trel = os.path.relpath(target, src)
                if trel.startswith(".."):
                    bad.append(f"{rel}: includes {m.group(1)}, outside src/")
                    continue
                seen += 1
                it = layer_of(trel)
                if it == me:
                    continue
                if it is None or RANK[it] >= RANK[me]:
                    how = "up" if it is not None and RANK[it] > RANK[me] else "across"
                    bad.append(f"{rel} ({me}, rank {RANK[me]}) includes {m.group(1)} ({it}, rank "
                               f"{RANK.get(it, '?')}): {how} a layer")
    return bad, seen


def self_test():
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.normpath(os.path.join(here, "..", "..", "src"))
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "src")
        shutil.copytree(src, copy)
        bad, _ = check(copy)
        if bad:
            print("the tree itself fails:\n  " + "\n  ".join(bad))
            return 1
        plants = [("base/err.c", '#include "../server/server.h"\n', "up"),
                  ("backend/cpu/ops.c", '#include "../cuda/cuda.h"\n', "across")]
        for rel, line, how in plants:
            p = os.path.join(copy, rel)
            with open(p) as fh:
                orig = fh.read()
            with open(p, "w") as fh:
                fh.write(line + orig)
            bad, _ = check(copy)
            with open(p, "w") as fh:
                fh.write(orig)
            if not any(rel in b and how in b for b in bad):
                print(f"FAIL: an include planted in {rel} ({how}) was not caught: {bad}")
                return 1
            print(f"ok   planted in {rel}: caught ({bad[0]})")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "src")
    bad, seen = check(src)
    for b in bad:
        print("FAIL", b)
    print(f"{seen} includes inside src/ checked against {len(LAYERS)} layers: {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
