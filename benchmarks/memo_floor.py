#!/usr/bin/env python3
"""What the C unpickler's memo keeps alive at the end of a `.metadata` load, by kind (MiB).

    python benchmarks/memo_floor.py DIR/.metadata [torch_peak_mib]

torch's pickle memoizes every object, and the memo holds each one until `load()` returns, so this
is the least memory any reader built on the C unpickler can peak at for the file.  The kinds:
objects no stand-in can shrink (the tuples, strings and ints the pickle builds itself), the memo
table (8 bytes per memoized object), the state dicts and lists at the size they are left at
(ckptdoctor's stand-ins empty each state dict), and the stand-ins themselves.  Sizes are
`sys.getsizeof` plus the 16-byte GC header of tracked objects; allocator slack is not counted.
"""
from __future__ import annotations

import gc
import resource
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(path: str, torch_peak_mib: float | None = None) -> None:
    gc.disable()
    from ckptdoctor.io.unpickle import RestrictedUnpickler
    with open(path, "rb") as fh:
        u = RestrictedUnpickler(fh)
        u.load()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    memo = u.memo.copy()
    kinds: Counter = Counter()
    floor = 8 * len(memo)   # what no choice of stand-ins changes
    seen: set[int] = set()
    for v in memo.values():
        if id(v) in seen:
            continue
        seen.add(id(v))
        size = sys.getsizeof(v) + (16 if gc.is_tracked(v) else 0)
        t = type(v)
        if t in (tuple, str, int, float, bytes, type) or isinstance(v, str):
            kinds["tuples, strings and ints the pickle builds (immutable)"] += size
            floor += size
        elif t in (dict, list):
            kinds[f"{t.__name__}s, as the stand-ins leave them"] += size
            # a state dict or list a stand-in empties still has its shell; the few big dicts
            # (state_dict_metadata, storage_data) are needed whole
            floor += size if len(v) > 64 else sys.getsizeof(t()) + 16
        else:
            kinds["stand-in records"] += size
            floor += 16   # an instance of a class with no slots at all
    kinds["memo table (8 bytes per memoized object)"] = 8 * len(memo)
    mib = 1 << 20
    total = sum(kinds.values())
    print(f"| memo of {path}: what it keeps alive | MiB |" + (" of torch's peak |" if torch_peak_mib else ""))
    print("|---|---|" + ("---|" if torch_peak_mib else ""))
    for k, v in kinds.most_common():
        print(f"| {k} | {v / mib:.0f} |" + (f" {v / mib / torch_peak_mib:.2f}x |" if torch_peak_mib else ""))
    print(f"| all of it | {total / mib:.0f} |" + (f" {total / mib / torch_peak_mib:.2f}x |" if torch_peak_mib else ""))
    print(f"| floor: the immutables, the memo table, every memoized dict and list emptied, every stand-in "
          f"a 16-byte object | {floor / mib:.0f} |" + (f" {floor / mib / torch_peak_mib:.2f}x |" if torch_peak_mib else ""))
    print(f"| peak RSS of this load (interpreter and allocator slack included) | {peak:.0f} |"
          + (f" {peak / torch_peak_mib:.2f}x |" if torch_peak_mib else ""))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else None)
