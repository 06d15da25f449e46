#!/usr/bin/env python3
"""Compares the machine code of every kernel in two sets of cubins (scripts/kernel_code.sh).

    scripts/kernel_diff.py OLD_DIR NEW_DIR [--renames scripts/kernel_renames.txt] [--allow FILE] [--sass]

Reads every OLD_DIR/*.cubin and NEW_DIR/*.cubin (ELF, sm_90a), takes each function's
`.text.<mangled name>` section (kernels and device functions that were not inlined), demangles
the names with c++filt (binutils) when it is there, maps old names through the rename map
(lines `old_name new_name`: plain identifiers, replaced as whole words inside the demangled
name; without c++filt, inside the mangled name's <length><identifier> pieces) and prints one
line per function:
    identical            same bytes (the file each came from is shown when it moved)
    identical-reloc      same bytes outside the instructions that carry relocations (a call
                         to a non-inlined function at another offset, a constant's address)
    CHANGED              different bytes (old and new sizes, and bytes that differ)
    only-old / only-new  no counterpart
Exits 1 when a function is CHANGED, only-old or only-new, unless its new name (old name for
only-old) is listed in the --allow file (one name a line: the demangled name, or just the
kernel's identifier, which allows every instantiation; `#` starts a comment). Python 3
standard library only.

--sass (on a machine with cuobjdump, e.g. the GPU machine): compares each function's SASS as
`cuobjdump -sass` prints it (instructions and their encodings, addresses dropped) instead of
the raw section bytes: the same verdict, read through NVIDIA's own disassembler.
"""
import argparse
import glob
import os
import re
import shutil
import struct
import subprocess
import sys

SHT_SYMTAB, SHT_RELA, SHT_REL = 2, 4, 9


def read_elf(path):
    """{section name: (bytes, index)}, [(offset, section index)] relocation offsets per target"""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit(f"{path}: not a little-endian ELF64 file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    shdrs = []
    for i in range(e_shnum):
        o = e_shoff + i * e_shentsize
        name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from("<IIQQQQIIQQ", data, o)
        shdrs.append((name, typ, off, size, link, info, entsize))
    stro = shdrs[e_shstrndx][2]

    def sname(n):
        e = data.index(b"\0", stro + n)
        return data[stro + n:e].decode()

    secs, relocs = {}, {}
    for i, (name, typ, off, size, link, info, entsize) in enumerate(shdrs):
        nm = sname(name)
        secs[nm] = (data[off:off + size] if typ != 8 else b"", i)  # 8: SHT_NOBITS
        if typ in (SHT_REL, SHT_RELA):
            ent = entsize or (24 if typ == SHT_RELA else 16)
            offs = [struct.unpack_from("<Q", data, off + k * ent)[0] for k in range(size // ent)]
            relocs.setdefault(info, []).extend(offs)
    return secs, relocs


def functions(d):
    """{mangled name: (code bytes, relocated offsets, cubin base name)} over d/*.cubin"""
    out = {}
    files = sorted(glob.glob(os.path.join(d, "*.cubin")))
    if not files:
        raise SystemExit(f"{d}: no .cubin files (scripts/kernel_code.sh TREE {d})")
    for f in files:
        secs, relocs = read_elf(f)
        base = os.path.basename(f)[:-6]
        for nm, (code, idx) in secs.items():
            if not nm.startswith(".text."):
                continue
            m = nm[len(".text."):]
            if m in out:
                print(f"warning: {m} in {out[m][2]} and {base}: the first kept", file=sys.stderr)
                continue
            out[m] = (code, relocs.get(idx, []), base)
    return out


def functions_sass(d):
    """{mangled name: (SASS text, [], cubin base name)} over d/*.cubin, through cuobjdump -sass"""
    exe = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    out = {}
    files = sorted(glob.glob(os.path.join(d, "*.cubin")))
    if not files:
        raise SystemExit(f"{d}: no .cubin files (scripts/kernel_code.sh TREE {d})")
    addr = re.compile(r"/\*[0-9a-f]{4,}\*/")
    for f in files:
        text = subprocess.run([exe, "-sass", f], capture_output=True, text=True, check=True).stdout
        base = os.path.basename(f)[:-6]
        name, lines = None, []
        for ln in text.split("\n") + ["Function : <end>"]:
            m = re.match(r"\s*Function : (\S+)", ln)
            if m:
                if name and name not in out:
                    out[name] = ("\n".join(lines).encode(), [], base)
                name, lines = m.group(1), []
            elif name and ("/*" in ln):
                lines.append(" ".join(addr.sub("", ln).split()))
    out.pop("<end>", None)
    return out


def demangle_all(names):
    if not names:
        return {}
    exe = shutil.which("c++filt")
    if not exe:
        return None
    r = subprocess.run([exe], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    dem = r.stdout.split("\n")[:len(names)]
    return dict(zip(names, dem))


def load_renames(path):
    ren = {}
    if not path:
        return ren
    for ln in open(path):
        ln = ln.split("#", 1)[0].strip()
        if not ln:
            continue
        parts = ln.split()
        if len(parts) != 2:
            raise SystemExit(f"{path}: bad line: {ln}")
        ren[parts[0]] = parts[1]
    return ren


def rename_demangled(name, ren):
    if not ren:
        return name
    pat = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(ren, key=len, reverse=True)) + r")\b")
    return pat.sub(lambda m: ren[m.group(1)], name)


def rename_mangled(name, ren):
    """<len><identifier> pieces of an Itanium-mangled name, identifiers renamed"""
    def sub(m):
        n = int(m.group(1))
        ident = m.group(2)[:n]
        rest = m.group(2)[n:]
        new = ren.get(ident, ident)
        return f"{len(new)}{new}{rest}"
    if name in ren:
        return ren[name]
    return re.sub(r"(\d+)([A-Za-z_][A-Za-z0-9_]*)", sub, name)


def ident_of(name):
    """a demangled function's identifier: `void k_x<1>(...)` -> k_x"""
    m = re.match(r"^(?:[^(<]*\s)?([A-Za-z_][A-Za-z0-9_:]*)\s*[<(]", name)
    return m.group(1) if m else name


def masked(code, offs):
    b = bytearray(code)
    for o in offs:
        o16 = o - o % 16  # sm_90 instructions are 16 bytes
        b[o16:o16 + 16] = b"\0" * min(16, len(b) - o16)
    return bytes(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--renames")
    ap.add_argument("--allow")
    ap.add_argument("--sass", action="store_true")
    args = ap.parse_args()
    ren = load_renames(args.renames)
    allow = set()
    if args.allow:
        for ln in open(args.allow):
            ln = ln.split("#", 1)[0].strip()
            if ln:
                allow.add(ln)
    read = functions_sass if args.sass else functions
    old, new = read(args.old), read(args.new)
    dem = demangle_all(sorted(set(old) | set(new)))
    if dem is None:
        print("note: c++filt not found: mangled names compared", file=sys.stderr)
        oldkey = {rename_mangled(m, ren): m for m in old}
        newkey = {m: m for m in new}
        show = {m: m for m in list(old) + list(new)}
    else:
        oldkey = {rename_demangled(dem[m], ren): m for m in old}
        newkey = {dem[m]: m for m in new}
        show = dem
    counts = {"identical": 0, "identical-reloc": 0, "CHANGED": 0, "only-old": 0, "only-new": 0}
    bad = []
    rows = []
    for key in sorted(set(oldkey) | set(newkey)):
        mo, mn = oldkey.get(key), newkey.get(key)
        oldname = show[mo] if mo else None
        if mo and mn:
            (co, ro, fo), (cn, rn, fn) = old[mo], new[mn]
            where = fn if fo == fn else f"{fo} -> {fn}"
            label = key if oldname == key else f"{key}  (was {ident_of(oldname)})"
            if co == cn:
                st, extra = "identical", ""
            elif len(co) == len(cn) and masked(co, ro) == masked(cn, rn):
                st, extra = "identical-reloc", f" ({len(ro)} relocated instructions)"
            else:
                st = "CHANGED"
                ndiff = sum(1 for a, b in zip(co, cn) if a != b) + abs(len(co) - len(cn))
                extra = f" (old {len(co)} bytes, new {len(cn)} bytes, {ndiff} bytes differ)"
            rows.append((st, f"{st:16s} {label}  [{where}]{extra}"))
            name = key
        elif mo:
            st, name = "only-old", key
            rows.append((st, f"{st:16s} {oldname}  [{old[mo][2]}]"))
        else:
            st, name = "only-new", key
            rows.append((st, f"{st:16s} {key}  [{new[mn][2]}]"))
        counts[st] += 1
        if st in ("CHANGED", "only-old", "only-new"):
            nm = oldname if st == "only-old" else name
            allowed = nm in allow or ident_of(nm) in allow
            if not allowed:
                bad.append(nm)
            else:
                rows[-1] = (st, rows[-1][1] + "  (allowed)")
    order = {"CHANGED": 0, "only-old": 1, "only-new": 2, "identical-reloc": 3, "identical": 4}
    for st, line in sorted(rows, key=lambda r: order[r[0]]):
        print(line)
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f"; {len(bad)} not allowed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
