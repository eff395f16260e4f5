"""safetensors headers, checked by the rules the safetensors library enforces (formats.md §6.2).

Only the 8-byte length and the JSON header are read; tensor bytes never are.  A truncated file
is caught because the last tensor's end must equal the file size exactly.  An absurd header
length is a finding, never an allocation: nothing larger than MAX_HEADER_BYTES is read.
"""
from __future__ import annotations

import json
import struct
from ..values import value, field

MAX_HEADER_BYTES = 100_000_000  # safetensors' own MAX_HEADER_SIZE
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
INDEX_SUFFIX = ".safetensors.index.json"


class HeaderError(ValueError):
    """What the safetensors loader would reject, in one line."""


@value
class Header:
    size: int                                        # header length N
    tensors: dict[str, tuple[str, tuple[int, ...], int, int]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_bytes(self) -> int:
        return max((end for _, _, _, end in self.tensors.values()), default=0)


def read_header(read_at, file_size: int) -> Header:
    """Read and check the header through `read_at(offset, n) -> bytes` (a pread, a ranged GET)."""
    head = read_at(0, 8)
    if len(head) < 8:
        raise HeaderError(f"file is {file_size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
        raise HeaderError(f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size:
        raise HeaderError(f"header length {n} runs past the end of the {file_size}-byte file")
    raw = read_at(8, n)
    if len(raw) < n:
        raise HeaderError("file shrank while reading the header")
    return parse_header(raw, file_size)


def parse_header(raw: bytes, file_size: int) -> Header:
    n = len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderError("header is not valid UTF-8") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HeaderError(f"header is not valid JSON ({str(exc)[:60]})") from None
    if not isinstance(doc, dict):
        raise HeaderError("header is not a JSON object")
    h = Header(n)
    meta = doc.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise HeaderError("__metadata__ must map strings to strings")
    h.metadata = meta
    spans = []
    for name, info in doc.items():
        if not isinstance(info, dict):
            raise HeaderError(f"tensor {name!r:.60}: entry is not an object")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in BITS:
            raise HeaderError(f"tensor {name!r:.60}: unknown dtype {dtype!r:.20}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 63
                                                  for d in shape) or len(shape) > 64:
            raise HeaderError(f"tensor {name!r:.60}: shape must be a list of at most 64 non-negative integers "
                              f"below 2^63 (the library's usize)")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                  and 0 <= o < 1 << 64 for o in offs)):
            raise HeaderError(f"tensor {name!r:.60}: data_offsets must be [begin, end]")
        b, e = offs
        if e < b:
            raise HeaderError(f"tensor {name!r:.60}: data_offsets end {e} before begin {b}")
        numel = 1
        for d in shape:
            numel *= d
        nbits = numel * BITS[dtype]
        if nbits % 8 or nbits // 8 != e - b:
            need = str(nbits // 8) if nbits % 8 == 0 else f"{nbits}/8"
            raise HeaderError(f"tensor {name!r:.60}: {dtype} {str(shape)[:80]} needs {need[:40]} bytes, "
                              f"data_offsets span {e - b}")
        h.tensors[name] = (dtype, tuple(shape), b, e)
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            what = "gap before" if b > pos else "overlap at"
            raise HeaderError(f"invalid offset for tensor {name!r:.60}: {what} byte {b} "
                              f"(previous tensor ends at {pos})")
        pos = e
    if 8 + n + pos != file_size:
        if 8 + n + pos > file_size:
            raise HeaderError(f"truncated: tensors end at byte {8 + n + pos} but the file is {file_size} bytes")
        raise HeaderError(f"file not fully covered: {file_size - (8 + n + pos)} trailing bytes after the "
                          f"last tensor")
    return h


def parse_index(data: bytes) -> tuple[dict[str, str], int | None]:
    """(weight_map, metadata.total_size) of a `*.safetensors.index.json`."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise HeaderError(f"index is not valid JSON ({str(exc)[:60]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise HeaderError("index has no weight_map object")
    wm = doc["weight_map"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise HeaderError("weight_map must map tensor names to shard file names")
    bad = [v for v in set(wm.values()) if "/" in v or v in ("", ".", "..")]
    if bad:
        raise HeaderError(f"weight_map names a shard outside the directory: {bad[0]!r:.60}")
    ts = (doc.get("metadata") or {}).get("total_size") if isinstance(doc.get("metadata"), dict) else None
    return wm, ts if isinstance(ts, int) and not isinstance(ts, bool) else None
