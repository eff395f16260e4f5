"""Cheap structural checks of torch.save zip archives, without torch and without unpickling.

A `.distcp` file is a concatenation of torch.save archives, one per write item; each slice
must start with a local-file-header and end with an end-of-central-directory record.
"""
from __future__ import annotations

import struct
from ..values import value

LOCAL_HEADER = b"PK\x03\x04"
EOCD = b"PK\x05\x06"
EOCD_LEN = 22
LEGACY_MAGIC_PREFIX = b"\x80\x02\x8a\x0a"  # protocol 2, LONG1 of the legacy magic number


Z64_LOCATOR = b"PK\x06\x07"   # zip64 end-of-central-directory locator (20 bytes, right before the EOCD)
Z64_EOCD = b"PK\x06\x06"      # zip64 end-of-central-directory record (56 bytes)
TAIL_LEN = 56 + 20 + EOCD_LEN  # where torch.save puts all three: the last 98 bytes of an archive
_EOCD = struct.Struct("<4x4H2L")     # this disk, cd disk, entries here, entries, cd size, cd offset
_LOCATOR = struct.Struct("<4x4xQL")  # zip64 record offset, total disks
_Z64 = struct.Struct("<4xQ4x2L4Q")   # record size, this disk, cd disk, entries here, entries, cd size, cd offset


def slice_problem(read, off: int, length: int) -> str | None:
    """None if the `length` bytes at `off` hold one whole zip archive as torch's reader (miniz)
    opens it; else what is wrong.  `read(pos, n)` returns the shard's bytes (fewer at its end).

    The end records are judged the way miniz reads them: a zip64 locator right before the EOCD
    whose zip64 record carries the signature makes the zip64 record the authority (torch.save
    always writes one, so its 32-bit EOCD fields are then never read); a locator pointing past the
    archive is fatal.  Measured against torch.load on real DCP shards: damage to the 32-bit
    fields alone loads (no finding), damage to the zip64 sizes or offset does not."""
    if length < 30 + EOCD_LEN:
        return f"slice of {length} bytes is too short to be a torch.save archive"
    if read(off, 4) != LOCAL_HEADER:
        return f"slice does not start with a zip record (found {read(off, 4).hex()})"
    n = min(TAIL_LEN, length)
    tail = read(off + length - n, n)
    if len(tail) != n or tail[-EOCD_LEN:-EOCD_LEN + 4] != EOCD:
        return "slice does not end with a zip end-of-central-directory record"
    this_disk, cd_disk, here, total, cd_size, cd_off = _EOCD.unpack_from(tail, n - EOCD_LEN)
    eocd_at = length - EOCD_LEN
    if eocd_at >= 20 + 56 and tail[n - EOCD_LEN - 20:n - EOCD_LEN - 16] == Z64_LOCATOR:
        z64_at, disks = _LOCATOR.unpack_from(tail, n - EOCD_LEN - 20)
        if z64_at > length - 56:
            return "zip64 end-of-central-directory locator points past the end of the slice"
        z64 = tail[n - TAIL_LEN:n - TAIL_LEN + 56] if z64_at == length - TAIL_LEN else read(off + z64_at, 56)
        if z64[:4] == Z64_EOCD and len(z64) == 56:
            rec_size, this_disk, cd_disk, here, total, cd_size, cd_off = _Z64.unpack_from(z64)
            if rec_size < 44:
                return "zip64 end-of-central-directory record is too short"
            if disks != 1:
                return f"zip64 locator claims {disks} disks (a torch.save archive is one)"
    if total != here or ((this_disk | cd_disk) and (this_disk, cd_disk) != (1, 1)):
        return "zip end-of-central-directory record describes a multi-disk archive"
    if cd_size < total * 46:
        return f"zip central directory of {cd_size} bytes is too small for its {total} entries"
    if cd_off + cd_size > length:
        return "zip central directory points past the end of the slice"
    return None


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
KNOWN_TRANSFORMS = ("stream.zstd/",)  # torch.distributed.checkpoint._extension.ZStandard


def transformed_problem(transforms: tuple[str, ...], head: bytes, length: int) -> str | None:
    """A record a DCP storage extension transformed (torch 2.13: zstd compression): its framing,
    since the bytes are no zip archive.  An unknown transform is reported, not passed."""
    unknown = [t for t in transforms if not t.startswith(KNOWN_TRANSFORMS)]
    if unknown:
        return f"written through an unknown storage transform {unknown[0]!r}: its bytes cannot be checked"
    if any(t.startswith("stream.zstd/") for t in transforms) and (length < 4 or head[:4] != ZSTD_MAGIC):
        return f"record is zstd-compressed by its metadata but does not start with a zstd frame (found {head[:4].hex()})"
    return None


def pickle_name(names) -> str | None:
    """The member torch.load unpickles: `data.pkl` in the directory of the archive's first member
    (PyTorchStreamReader names the archive after its first record, torch 2.13); None when there is
    none.  Not "the first name ending in data.pkl": an archive led by `archive/extra_data.pkl`
    loads `archive/data.pkl`, and checking the other one let a NaN, or a pickle that runs code, pass."""
    first = next(iter(names), "")
    top, slash, _ = first.partition("/")
    want = f"{top}/data.pkl"
    return want if slash and want in names else None


def archive_problem(fh, max_members: int = 100_000) -> str | None:
    """Open a whole `.pt` as a zip (central directory only): None if it is sound."""
    head = fh.read(4)
    fh.seek(0)
    if head == LEGACY_MAGIC_PREFIX:
        return None  # pre-1.6 torch.save format: a bare pickle stream; nothing structural to check
    if not head:
        return "file is empty"
    import zipfile  # here: it pulls bz2, lzma and shutil (~5 ms of start-up) for whole-.pt checks only
    try:
        with zipfile.ZipFile(fh) as zf:
            names = zf.namelist()
            if len(names) > max_members:
                return f"zip has {len(names)} members (limit {max_members})"
            if pickle_name(names) is None:
                return "zip has no data.pkl beside its first member: not a torch.save archive"
            size = fh.seek(0, 2)
            for info in zf.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"member {info.filename} extends past the end of the file"
    except zipfile.BadZipFile as exc:
        return f"not a zip archive ({exc})"
    except (OSError, ValueError, EOFError, struct.error) as exc:
        return f"unreadable zip ({type(exc).__name__}: {exc})"
    return None


# ---- the central directory, read by hand (for `verify --deep`) -----------------------------------
# zipfile cannot read an archive embedded at an offset of a larger file without copying it, and a
# DCP shard holds thousands of them; these ~60 lines read one from any buffer (an mmap, a pread
# window) with every number bounds-checked.
CD_SIG, LOCAL_SIG = b"PK\x01\x02", b"PK\x03\x04"
Z64_LOCATOR, Z64_EOCD = b"PK\x06\x07", b"PK\x06\x06"


class ZipDirError(ValueError):
    """The archive's directory cannot be read (one line, names what is wrong)."""


@value(frozen=True)
class Member:
    """One stored record of a zip archive: where its bytes are (absolute offsets in the buffer
    given to `members`), how they are stored, and the CRC-32 the writer recorded."""
    name: str
    start: int
    size: int
    compressed: int
    method: int
    crc: int


def members(read, base: int, length: int, limit: int = 100_000) -> list[Member]:
    """The members of the zip archive occupying bytes [base, base + length) of a buffer read
    through `read(offset, n) -> bytes`.  Raises ZipDirError for anything out of bounds."""
    end = base + length
    if length < EOCD_LEN:
        raise ZipDirError(f"{length} bytes is too short for a zip archive")
    tail = read(max(base, end - EOCD_LEN - 0xFFFF), min(length, EOCD_LEN + 0xFFFF))
    at = tail.rfind(EOCD)
    if at < 0 or len(tail) - at < EOCD_LEN:
        raise ZipDirError("no end-of-central-directory record")
    eocd = end - (len(tail) - at)
    _, _, _, _, count, cd_size, cd_off, _ = struct.unpack("<4s4H2LH", tail[at:at + EOCD_LEN])
    # The end records as torch's reader (miniz) takes them: a zip64 locator right before the EOCD
    # whose record carries its signature makes that record the authority (torch always writes
    # both), a locator pointing past the archive is fatal, and without a zip64 record the 32-bit
    # fields count.  Offsets are from the archive's start: miniz allows no prepended bytes.
    # Measured against dcp.load: a damaged zip64 or locator signature loads, and was a false
    # "directory unreadable" here while this searched for prepended bytes and required the record.
    zip64 = False
    loc = read(eocd - 20, 20) if eocd - 20 - 56 >= base else b""
    if loc[:4] == Z64_LOCATOR:
        z64 = struct.unpack("<Q", loc[8:16])[0]
        if z64 > length - 56:
            raise ZipDirError("zip64 end-of-central-directory locator points past the archive")
        rec = read(base + z64, 56)
        if rec[:4] == Z64_EOCD and len(rec) == 56:
            count, cd_size, cd_off = struct.unpack("<QQQ", rec[32:56])
            eocd, zip64 = base + z64, True  # the directory ends where the zip64 record starts
    if not zip64 and (0xFFFFFFFF in (cd_size, cd_off) or count == 0xFFFF):
        raise ZipDirError("zip64 sizes without a zip64 record")
    if count > limit or cd_size > limit * 1024:  # every read stays bounded, whatever the numbers say
        raise ZipDirError(f"{count} members in a {cd_size}-byte directory (limit {limit} members)")
    cd_start = base + cd_off
    if cd_start + cd_size > eocd:
        raise ZipDirError("central directory lies outside the archive")
    cd = read(cd_start, cd_size)
    out, pos = [], 0
    for _ in range(count):
        if cd[pos:pos + 4] != CD_SIG or pos + 46 > len(cd):
            raise ZipDirError(f"central directory entry {len(out)} is damaged")
        (method, crc, csize, usize, nlen, xlen, clen, lho) = struct.unpack("<10xH4xLLLHHH8xL", cd[pos:pos + 46])
        name = cd[pos + 46:pos + 46 + nlen].decode("utf-8", "replace")
        extra = cd[pos + 46 + nlen:pos + 46 + nlen + xlen]
        pos += 46 + nlen + xlen + clen
        if 0xFFFFFFFF in (csize, usize, lho):
            usize, csize, lho = _zip64_extra(extra, usize, csize, lho, name)
        local = base + lho
        head = read(local, 30) if local + 30 <= end else b""
        if head[:4] != LOCAL_SIG:
            raise ZipDirError(f"member {name}: no local header where the directory points")
        lnlen, lxlen = struct.unpack("<HH", head[26:30])
        start = local + 30 + lnlen + lxlen
        if start + csize > cd_start:
            raise ZipDirError(f"member {name} extends past its archive's data")
        out.append(Member(name, start, usize, csize, method, crc))
    return out


def fingerprint(fh, limit: int = 100_000) -> tuple | None:
    """What identifies a whole `.pt` archive without reading its data: its size and every member's
    name, size and the CRC-32 its writer recorded (the central directory and the local headers, a
    few kilobytes).  Two archives with the same fingerprint hold the same bytes unless someone
    forged CRCs; None when the directory cannot be read (CKD117 says why)."""
    size = fh.seek(0, 2)

    def read(off: int, n: int) -> bytes:
        fh.seek(off)
        return fh.read(n)
    try:
        return (size, tuple((m.name, m.size, m.crc) for m in members(read, 0, size, limit)))
    except (ZipDirError, struct.error, OSError, ValueError):
        return None


def _zip64_extra(extra: bytes, usize: int, csize: int, lho: int, name: str) -> tuple[int, int, int]:
    i = 0
    while i + 4 <= len(extra):
        tag, n = struct.unpack("<HH", extra[i:i + 4])
        if tag == 1:
            vals, j = [], i + 4
            for v in (usize, csize, lho):
                if v == 0xFFFFFFFF:
                    if j + 8 > i + 4 + n:
                        break
                    vals.append(struct.unpack("<Q", extra[j:j + 8])[0])
                    j += 8
                else:
                    vals.append(v)
            if len(vals) == 3:
                return vals[0], vals[1], vals[2]
        i += 4 + n
    raise ZipDirError(f"member {name}: zip64 sizes without their extra field")
