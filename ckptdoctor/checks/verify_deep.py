"""`verify --deep`: what sizes and headers cannot see, read from the tensor bytes themselves,
without torch.  This first part covers safetensors files (memory-mapped, one bounded window at a
time): NaN/Inf by bit pattern for every float dtype (F64, F32, F16, BF16, F8_E5M2, F8_E4M3), and
the crash signature of delayed allocation, a 4 KiB-aligned all-zero run reaching the end of the
file inside a tensor that is non-zero before it (a tensor that is zero throughout, like a fresh
bias, is not flagged).  DCP and `.pt` records are not scanned yet.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

from ..engine.finding import Hit
from ..engine.registry import check
from ..io.fs import open_regular
from ..layouts import safetensors as stf

WINDOW = 64 << 20   # bytes examined at once: memory stays bounded whatever the file size
PAGE = 4096
# dtype -> (element bytes, exponent-all-ones mask, mantissa mask); a value is non-finite when its
# exponent bits are all ones (F8_E4M3 has no Inf: only S.1111.111 is NaN)
FLOATS = {"F64": (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF), "F32": (4, 0x7F800000, 0x007FFFFF),
          "F16": (2, 0x7C00, 0x03FF), "BF16": (2, 0x7F80, 0x007F), "F8_E5M2": (1, 0x7C, 0x03),
          "F8_E4M3": (1, 0x7F, 0x00)}
UINT = {8: "<u8", 4: "<u4", 2: "<u2", 1: "u1"}


@dataclass
class DeepResult:
    nonfinite: list[dict] = field(default_factory=list)   # {file, tensor, dtype, nan, inf}
    zero_tails: list[dict] = field(default_factory=list)  # {file, tensor, start, end}
    skipped: list[str] = field(default_factory=list)      # files not scanned (reported as CKD901)


def scan(ck, eng) -> DeepResult | None:
    if not eng.opt("deep"):
        return None
    if "deep" in ck.results:
        return ck.results["deep"]
    res = ck.results["deep"] = DeepResult()
    files = [n for n in sorted(ck.files) if n.endswith(".safetensors")]
    why = None
    if files and not ck.storage.local:
        why = "reads local files only"
    elif files:
        try:
            import numpy as np
        except ImportError:
            why = "needs numpy (pip install numpy)"
    if why:  # fail closed: what was asked for and not scanned is not "fine"
        for n in files:
            eng.emit("CKD901", Hit(ck.path(n), f"--deep {why}: {n} was not scanned", details={"file": n}))
        res.skipped += files
        return res
    for name in files:
        path = ck.storage.abspath(ck.relpath(name))
        size = ck.files[name].size
        try:
            hdr = stf.read_header(lambda off, n: ck.storage.read_range(ck.relpath(name), off, n), size)
        except (stf.HeaderError, OSError):
            continue  # CKD120 reports it
        if size == 0:
            continue
        try:
            fh = os.fdopen(open_regular(path), "rb")
        except OSError:
            continue  # listed a moment ago; the structural checks report what it is now
        with fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            base = 8 + hdr.size
            for tname, (dtype, _shape, b, e) in sorted(hdr.tensors.items(), key=lambda t: t[1][2]):
                if dtype not in FLOATS or e <= b:
                    continue
                nan, inf = _count_nonfinite(np, mm, dtype, base + b, base + e)
                if dtype == "F8_E4M3":  # no Inf in E4M3: S.1111.111 (the mask above) is its only NaN
                    nan, inf = nan + inf, 0
                if nan or inf:
                    res.nonfinite.append({"file": name, "tensor": tname, "dtype": dtype, "nan": nan, "inf": inf})
            tail = _zero_tail(mm, size)
            if tail is not None:
                owner = next(((t, b, e) for t, (_d, _s, b, e) in hdr.tensors.items() if base + b <= tail < base + e), None)
                if owner is not None and _any_nonzero(mm, base + owner[1], tail):
                    res.zero_tails.append({"file": name, "tensor": owner[0], "start": tail, "end": size})
    return res


def _count_nonfinite(np, mm, dtype: str, start: int, end: int) -> tuple[int, int]:
    """(NaN, Inf) counts over bytes [start, end), one window at a time (the arrays are views of the
    map and die with this frame, before the map is closed)."""
    width, expo, mant = FLOATS[dtype]
    nan = inf = 0
    step = WINDOW - WINDOW % width
    for off in range(start, end, step):
        arr = np.frombuffer(mm, dtype=UINT[width], count=min(step, end - off) // width, offset=off)
        bad = (arr & expo) == expo
        if bad.any():
            m = (arr[bad] & mant) != 0
            nan += int(m.sum())
            inf += int((~m).sum())
        del arr, bad
    return nan, inf


def _any_nonzero(mm, start: int, end: int) -> bool:
    """Is any byte in [start, end) non-zero?  One bounded window at a time (a slice of the map is a copy)."""
    for off in range(start, end, WINDOW):
        if any(mm[off:min(end, off + WINDOW)]):
            return True
    return False


def _zero_tail(mm, size: int) -> int | None:
    """Start of the 4 KiB-aligned all-zero run that reaches the end of the file (at least one whole
    page), or None."""
    end = size
    pos = (size // PAGE) * PAGE
    if pos == size:
        pos -= PAGE
    first = None
    while pos >= 0:
        if any(mm[pos:end]):
            break
        first, end = pos, pos
        pos -= PAGE
    if first is None or size - first < PAGE:
        return None
    return first


@check("CKD130", "checkpoint", option="deep")
def nonfinite_values(ck, eng):
    res = scan(ck, eng)
    for d in (res.nonfinite if res else []):
        yield Hit(ck.path(d["file"]), f"{d['file']}: tensor {d['tensor']} ({d['dtype']}) holds {d['nan']} NaN and "
                                      f"{d['inf']} Inf value(s)", details=d,
                  hint="a run resumed from this checkpoint diverges; resume from an earlier one")


@check("CKD131", "checkpoint", option="deep")
def zero_filled_tail(ck, eng):
    res = scan(ck, eng)
    for d in (res.zero_tails if res else []):
        yield Hit(ck.path(d["file"]), f"{d['file']}: bytes {d['start']}-{d['end']} are all zero to the end of the "
                                      f"file, inside tensor {d['tensor']}, which is non-zero before them",
                  details=d, hint="the signature of a crash before delayed allocation reached the disk (size and "
                                  "header intact); check against a manifest, or resume from an earlier checkpoint")
