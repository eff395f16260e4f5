#!/usr/bin/env python3
"""How fast could a parser of our own read a `.metadata` torch writes?  The probe (session 12) that
led to the reader ckptdoctor now uses, `ckptdoctor/io/dcp_pickle.py` (session 13); kept as the
measurement of the design, and not imported by it.

    python benchmarks/template_probe.py [DIR]    # DIR: a DCP checkpoint; default: build 200k records

The C unpickler's memo keeps every object of the pickle alive until `load()` returns, which puts
a floor of 0.51x torch's peak under any reader built on it (`memo_floor.py`).  A parser that keeps
no such memo was assumed too slow in Python, because it was pictured as a loop over opcodes
(`pickle._Unpickler`: 14x the C unpickler).  This probe measures the other design: one compiled
regex per steady-state record shape, matched record after record.  The regex carries the memo
indices of the classes and keys as literal bytes, read off the file's second record, and each
match yields the fields of one record.  It times the tensor records and the storage records
against the C unpickler's `load()` of the same file (ckptdoctor's restricted unpickler).  What it
does not do, and a real reader would have to: fall back at a record it does not match (it stops
there and reports how many it covered), resolve strings memoized earlier (it leaves them None),
and prove its reading equal to the C unpickler's on real and mutated files.
"""
from __future__ import annotations

import gc
import os
import pickletools
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build() -> str:
    """The 200k-record checkpoint `run.py structural` measures (common.build_torch_metadata)."""
    from common import build_torch_metadata
    d = tempfile.mkdtemp(prefix="ckd-probe-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    build_torch_metadata(d)
    return d


def unframe(data: bytes) -> bytes:
    """The opcodes without their FRAME headers (protocol 4 frames end at opcode boundaries)."""
    out, pos = bytearray(data[:2]), 2
    while pos < len(data) and data[pos] == 0x95:
        n = int.from_bytes(data[pos + 1:pos + 9], "little")
        out += data[pos + 9:pos + 9 + n]
        pos += 9 + n
    out += data[pos:]
    return bytes(out)


def gets(buf: bytes, start: int, count: int) -> list[tuple[int, str, object]]:
    """(position, opcode name, argument) of `count` opcodes from `start`."""
    out = []
    for op, arg, pos in pickletools.genops(buf[start:]):
        out.append((start + pos, op.name, arg))
        if len(out) == count:
            break
    return out


def ref(i: int) -> bytes:
    return b"h" + bytes([i]) if i < 256 else b"j" + i.to_bytes(4, "little")


SIZE = rb"((?:K.|M..|J....){1,3})[\x85\x86\x87]\x94\x85\x94R\x94"   # torch.Size((d0[, d1[, d2]]))
INT = rb"(K.|M..|J....)"
STR = rb"(?:\x8c(.)(.{0,255}?)\x94|(?:h.|j....))"   # a new short string (length checked after), or a ref
NEW = rb"\)\x81\x94\}\x94\("                  # EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT MEMOIZE MARK


def ints(raw: bytes, cache: dict) -> tuple[int, ...]:
    t = cache.get(raw)
    if t is None:
        vals, i = [], 0
        while i < len(raw):
            w = {0x4B: 1, 0x4D: 2, 0x4A: 4}[raw[i]]
            vals.append(int.from_bytes(raw[i + 1:i + 1 + w], "little", signed=w == 4))
            i += 1 + w
        t = cache[raw] = tuple(vals)
    return t


def tensor_template(buf: bytes):
    """The regex of a tensor record, from the memo refs of the second one in state_dict_metadata."""
    at = buf.index(b"state_dict_metadata") - 2
    ops = gets(buf, at, 400)
    names = [i for i, o in enumerate(ops) if o[1] == "SHORT_BINUNICODE" and o[0] > at + 30
             and ops[i + 1][1] == "MEMOIZE" and ops[i + 2][1] in ("BINGET", "LONG_BINGET")
             and ops[i + 3][1] == "EMPTY_TUPLE"]   # a fqn, then its class by ref: not the first record
    first = names[0]
    g = [a for _, n, a in ops[first:first + 80] if n in ("BINGET", "LONG_BINGET")]
    # the second record's refs: TSM, 'properties', TP, dtype, layout, memory format, 'size', Size,
    # 'chunks', CSM, 'offsets', Size, 'sizes', Size
    tsm, props, tp, _dtype, layout, memfmt, size_k, size_c, chunks_k, csm, offs_k, _, sizes_k, _ = g[:14]
    pat = re.compile(
        rb"\x94" + re.escape(ref(tsm)) + NEW + re.escape(ref(props) + ref(tp)) + rb"\)\x81\x94\("
        rb"(h.|j....)" + re.escape(ref(layout)) + rb"[\x88\x89]" + re.escape(ref(memfmt)) + rb"[\x88\x89]t\x94b"
        + re.escape(ref(size_k) + ref(size_c)) + SIZE + re.escape(ref(chunks_k)) + rb"\]\x94" + re.escape(ref(csm))
        + NEW + re.escape(ref(offs_k) + ref(size_c)) + SIZE + re.escape(ref(sizes_k) + ref(size_c)) + SIZE
        + rb"ubaub", re.S)
    return pat, ops[first][0]


def storage_template(buf: bytes):
    """The regex of a storage record (MetadataIndex, then _StorageInfo), from the second one."""
    at = buf.index(b"storage_data") - 2
    ops = gets(buf, at, 200)
    new = [i for i, o in enumerate(ops) if o[1] == "NEWOBJ"]
    start = new[2] - 2   # the second MetadataIndex: its class ref, EMPTY_TUPLE, NEWOBJ
    it = iter(ops[start:])

    def next_ref():
        for _, name, arg in it:
            if name in ("BINGET", "LONG_BINGET"):
                return arg
            if name == "SHORT_BINUNICODE":
                next(it)   # its MEMOIZE
                return None
        raise SystemExit("no storage record found")
    mi, fqn_k = next_ref(), next_ref()
    next_ref()   # the fqn: a new string or a ref to one
    offset_k, size_c, index_k, si, rel_k = (next_ref() for _ in range(5))
    next_ref()   # the relative path: a new string or a ref to one
    offset2_k, length_k = next_ref(), next_ref()
    if offset2_k != offset_k:
        raise SystemExit("storage record of another shape than the probe's template")
    pat = re.compile(
        re.escape(ref(mi)) + NEW + re.escape(ref(fqn_k)) + STR + re.escape(ref(offset_k) + ref(size_c)) + SIZE
        + re.escape(ref(index_k)) + rb"Nub" + re.escape(ref(si)) + NEW + re.escape(ref(rel_k)) + STR
        + re.escape(ref(offset_k)) + INT + re.escape(ref(length_k)) + INT + rb"ub", re.S)
    return pat, ops[start][0]


def scan(buf: bytes, pat, pos: int, record, fqn_first: bool) -> tuple[int, int]:
    """Records matched from `pos` on, across the pickler's SETITEMS batches; (count, stop)."""
    n, match, cache = 0, pat.match, {}
    while True:
        if fqn_first and buf[pos] == 0x8C:   # a tensor record opens with its fqn, a new string
            k = buf[pos + 1]
            m = match(buf, pos + 2 + k)
            if m is None:
                break
            record(buf[pos + 2:pos + 2 + k].decode(), m.groups(), cache)
        else:
            m = match(buf, pos)
            if m is None:
                if buf[pos:pos + 2] == b"u(":   # SETITEMS MARK: the pickler's next batch of 1000
                    pos += 2
                    continue
                break
            record(None, m.groups(), cache)
        pos = m.end()
        n += 1
    return n, pos


def main(d: str | None = None) -> None:
    d = d or build()
    data = open(os.path.join(d, ".metadata"), "rb").read()
    buf = unframe(data)
    tensors, storage = [], []

    def tensor(fqn, g, cache):
        tensors.append((fqn, ints(g[1], cache), g[0], [(ints(g[2], cache), ints(g[3], cache))]))

    def store(_, g, cache):
        fl, fs, s1, rl, rs, o, ln = g
        if fs is not None and len(fs) != fl[0] or rs is not None and len(rs) != rl[0]:
            raise SystemExit("a string's length byte disagrees with the match: the real reader falls back here")
        storage.append((fs and fs.decode(), ints(s1, cache), rs and (cache.get(rs) or cache.setdefault(rs, rs.decode())),
                        ints(o, cache)[0], ints(ln, cache)[0]))

    gc.disable()
    tpat, tpos = tensor_template(buf)
    spat, spos = storage_template(buf)
    t = time.perf_counter()
    nt, _ = scan(buf, tpat, tpos, tensor, True)
    t1 = time.perf_counter()
    ns, _ = scan(buf, spat, spos, store, False)
    t2 = time.perf_counter()
    from ckptdoctor.io.unpickle import loads_dcp
    t3 = time.perf_counter()
    loads_dcp(data)
    t4 = time.perf_counter()
    pairs = min(nt, ns)
    print(f"file: {d}/.metadata, {len(data) / 1e6:.0f} MB")
    print("| reader | records | s | us per record |\n|---|---|---|---|")
    print(f"| template, tensor records | {nt} | {t1 - t:.3f} | {(t1 - t) / nt * 1e6:.2f} |")
    print(f"| template, storage records | {ns} | {t2 - t1:.3f} | {(t2 - t1) / ns * 1e6:.2f} |")
    print(f"| template, both (per pair) | {pairs} | {t2 - t:.3f} | {(t2 - t) / pairs * 1e6:.2f} |")
    print(f"| C unpickler `load()` of the whole file (per pair) | {pairs} | {t4 - t3:.3f} | "
          f"{(t4 - t3) / pairs * 1e6:.2f} |")
    print(f"\nfirst and last records read: {tensors[0]} {tensors[-1]} / {storage[0]} {storage[-1]}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
