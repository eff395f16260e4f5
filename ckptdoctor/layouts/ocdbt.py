"""OCDBT (TensorStore's Optionally-Cooperative Distributed B+Tree, Orbax's default array store):
just enough of the on-disk format to tell a whole file from a cut one and to find the data files
a tree's root names.

Every OCDBT file -- the manifest, b-tree nodes and data files under `d/` -- starts with a 4-byte
magic (0x0cdb3a2a manifest, 0x0cdb20de node/data) and the file's total length as a little-endian
uint64, measured on orbax-checkpoint 0.12.8 / tensorstore writes (every file's header length equal
to its size).  Node files name out-of-line data files by path relative to the item directory
(`d/<32 hex>` or `ocdbt.process_<i>/d/<32 hex>`); in a zstd-compressed node the names may not be
readable, so absence of a name proves nothing (the check only ever reports names it read).
"""
from __future__ import annotations

import re
import struct

MAGICS = {b"\x0c\xdb\x3a\x2a": "manifest", b"\x0c\xdb\x20\xde": "node"}
HEADER = 12
REF = re.compile(rb"(?<![0-9a-zA-Z_./])((?:ocdbt\.process_[0-9]+/)?d/[0-9a-f]{32})(?![0-9a-f])")


def header_problem(head: bytes, size: int) -> str | None:
    """None when the 12-byte header says this is an OCDBT file of exactly `size` bytes."""
    if len(head) < HEADER:
        return f"{size} bytes: shorter than the 12-byte OCDBT header"
    if head[:4] not in MAGICS:
        return f"no OCDBT magic (starts {head[:4].hex()})"
    (length,) = struct.unpack("<Q", head[4:12])
    if length != size:
        return f"its header says {length} bytes, the file has {size}" + (" (truncated)" if size < length else "")
    return None


def references(data: bytes) -> set[str]:
    """The data-file paths (relative to the item directory) readable in a manifest or node file."""
    return {m.group(1).decode() for m in REF.finditer(data)}


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_BLOCKS = 200_000   # a walk that long proves nothing more; it stops without a verdict


def zstd_problem(read, size: int) -> str | None:
    """A value file written as zstd frames back to back (TensorStore's zstd-compressed values): walk
    the frame and block headers (3 bytes per block, never the payload) and report a frame that runs
    past the end of the file.  Anything after the last whole frame that is not a frame ends the walk
    with no verdict (an uncompressed value may follow)."""
    off, blocks = 0, 0
    while off < size:
        head = read(off, 18)
        if head[:4] != ZSTD_MAGIC:
            return None
        if len(head) < 6:
            return f"zstd frame at byte {off} is cut inside its header"
        fhd = head[4]
        fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        pos = off + 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag] + \
            ((1 if single else 0), 2, 4, 8)[fcs_flag]
        while True:
            blocks += 1
            if blocks > MAX_BLOCKS:
                return None
            bh = read(pos, 3)
            if len(bh) < 3:
                return f"zstd frame at byte {off} is cut: a block header at byte {pos} is past the end of the file"
            v = bh[0] | bh[1] << 8 | bh[2] << 16
            last, btype, bsize = v & 1, (v >> 1) & 3, v >> 3
            if btype == 3:
                return f"zstd frame at byte {off}: reserved block type at byte {pos} (not a zstd stream)"
            pos += 3 + (1 if btype == 1 else bsize)
            if pos > size:
                return f"zstd frame at byte {off} needs {pos} bytes, the file has {size} (truncated)"
            if last:
                break
        off = pos + (4 if checksum else 0)
        if off > size:
            return f"zstd frame at byte {off} is cut inside its checksum (truncated)"
    return None
