"""Cheap structural checks of torch.save zip archives, without torch and without unpickling.

A `.distcp` file is a concatenation of torch.save archives, one per write item; each slice
must start with a local-file-header and end with an end-of-central-directory record.
"""
from __future__ import annotations

import struct
import zipfile

LOCAL_HEADER = b"PK\x03\x04"
EOCD = b"PK\x05\x06"
EOCD_LEN = 22
LEGACY_MAGIC_PREFIX = b"\x80\x02\x8a\x0a"  # protocol 2, LONG1 of the legacy magic number


def slice_problem(head: bytes, tail: bytes, length: int) -> str | None:
    """None if the slice looks like one whole zip archive; else what is wrong."""
    if length < 30 + EOCD_LEN:
        return f"slice of {length} bytes is too short to be a torch.save archive"
    if head[:4] != LOCAL_HEADER:
        return f"slice does not start with a zip record (found {head[:4].hex()})"
    if tail[:4] != EOCD:
        return "slice does not end with a zip end-of-central-directory record"
    # EOCD: central directory size and offset must fall inside the slice
    try:
        _, _, _, _, _, cd_size, cd_off, _ = struct.unpack("<4s4H2LH", tail[:EOCD_LEN])
    except struct.error:
        return "slice has a short end-of-central-directory record"
    if cd_off != 0xFFFFFFFF and cd_off + cd_size > length:
        return "zip central directory points past the end of the slice"
    return None


def archive_problem(fh, max_members: int = 100_000) -> str | None:
    """Open a whole `.pt` as a zip (central directory only): None if it is sound."""
    head = fh.read(4)
    fh.seek(0)
    if head == LEGACY_MAGIC_PREFIX:
        return None  # pre-1.6 torch.save format: a bare pickle stream; nothing structural to check
    if not head:
        return "file is empty"
    try:
        with zipfile.ZipFile(fh) as zf:
            names = zf.namelist()
            if len(names) > max_members:
                return f"zip has {len(names)} members (limit {max_members})"
            if not any(n.endswith("data.pkl") for n in names):
                return "zip has no data.pkl: not a torch.save archive"
            size = fh.seek(0, 2)
            for info in zf.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"member {info.filename} extends past the end of the file"
    except zipfile.BadZipFile as exc:
        return f"not a zip archive ({exc})"
    except (OSError, ValueError, EOFError, struct.error) as exc:
        return f"unreadable zip ({type(exc).__name__}: {exc})"
    return None
