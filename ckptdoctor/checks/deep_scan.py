"""`verify --deep` (the scan; the rules are in verify_deep.py): what sizes and headers cannot see, read from the tensor bytes themselves,
without torch.

Every file that holds tensors becomes a list of records, each a byte range with its element type
and, for torch zip archives, the CRC-32 the writer stored:
  * `.safetensors`: the tensors of the header;
  * DCP `.distcp`: each write item the metadata places in the file is a torch.save archive; its
    members (tensor bytes, with the dtype from `.metadata`) are found through the archive's own
    directory at the item's offset;
  * `.pt`/`.pth`/`.bin`/`.ckpt` zip archives: the `data/<key>` members, with each storage's dtype
    read from data.pkl by a restricted unpickler (nothing in it is run).
Per record: NaN/Inf counted by bit pattern for F64/F32/F16/BF16/F8 (CKD130), the stored CRC-32
checked against the bytes (CKD132), and per file the crash signature of delayed allocation, a
4 KiB-aligned all-zero run reaching the end of the file inside a record that is non-zero before
it (CKD131; a record zero throughout, like a fresh bias, is not flagged).

Speed: records are read with pread into one 1 MiB buffer per thread (the window stays in cache for
the CRC and the NaN test) and spread over the cores present.  Not mmap: it measured 7.3 (pread)
against 5.1 GB/s once and 5.3 against 5.6 on a later VM, and a shard truncated while it is mapped
kills the process with SIGBUS where pread returns a short read we report.  ISA-L's CRC-32 (the `deep` extra)
runs at 65 GB/s where zlib's manages 6.9.  benchmarks/deep_bench.py compares with `cat`.  Memory:
one buffer per thread, whatever the file size.
"""
from __future__ import annotations

import os
import pickle
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..engine.finding import Hit
from ..io.fs import NotRegularFile, TreeLimit, aligned_buffer, open_regular, walk_files
from ..layouts import ptzip
from ..layouts import safetensors as stf

WINDOW = 1 << 20   # bytes per read per thread (a multiple of every element width); measured on 2 GiB
                   # page-cached: 1 MiB 16.5 GB/s (DCP), 256 KiB 12.0, 4 MiB 15.8, 16 MiB 6.5
PAGE = 4096
# dtype -> (element bytes, exponent-all-ones mask, mantissa mask); a value is non-finite when its
# exponent bits are all ones (F8_E4M3 has no Inf: only S.1111.111 is NaN)
FLOATS = {"F64": (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF), "F32": (4, 0x7F800000, 0x007FFFFF),
          "F16": (2, 0x7C00, 0x03FF), "BF16": (2, 0x7F80, 0x007F), "F8_E5M2": (1, 0x7C, 0x03),
          "F8_E4M3": (1, 0x7F, 0x00)}
# torch's names (DCP metadata says "torch.float32", a storage class says "float32") -> ours
TORCH_FLOATS = {"float64": "F64", "double": "F64", "float32": "F32", "float": "F32", "float16": "F16",
                "half": "F16", "bfloat16": "BF16", "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3"}
UINT = {8: "<u8", 4: "<u4", 2: "<u2", 1: "u1"}
NATIVE = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}  # numpy's isfinite: 64 GB/s against 32 for the mask
TENSOR_SUFFIXES = (".safetensors", ".distcp", ".pt", ".pth", ".bin", ".ckpt")
STORED = 0  # zip method: stored (torch.save never compresses tensor bytes)


def _crc32_impl():
    """ISA-L's CRC-32 when installed (`pip install 'ckptdoctor[deep]'`): 65 GB/s here against 6.9 GB/s
    for zlib's on the same 4 MiB buffer (the same polynomial, same values); zlib's otherwise."""
    try:
        from isal.isal_zlib import crc32
        return crc32
    except ImportError:
        return zlib.crc32


CRC32 = _crc32_impl()


@dataclass(frozen=True)
class Record:
    """A byte range of one file that holds one tensor (or one archive member)."""
    file: str
    name: str
    start: int
    end: int
    dtype: str | None = None   # one of FLOATS, or None: no NaN test
    crc: int | None = None     # the CRC-32 the archive stored, or None: nothing to compare


@dataclass
class RecordScan:
    nan: int = 0
    inf: int = 0
    crc: int | None = None      # computed, when the record has one to compare
    short: bool = False         # the file ended before the record did


@dataclass
class DeepResult:
    nonfinite: list[dict] = field(default_factory=list)    # {file, tensor, dtype, nan, inf}
    zero_tails: list[dict] = field(default_factory=list)   # {file, tensor, start, end}
    bad_crc: list[dict] = field(default_factory=list)      # {file, record, expected, actual}
    unreadable: list[dict] = field(default_factory=list)   # {file, why}: archive directory damaged
    skipped: list[str] = field(default_factory=list)       # files not scanned (reported as CKD901)
    units: int = 0                                          # files scanned by this process (--slice)
    bytes: int = 0
    records: int = 0


def scan(ck, eng) -> DeepResult | None:
    if not eng.opt("deep"):
        return None
    if "deep" in ck.results:
        return ck.results["deep"]
    res = ck.results["deep"] = DeepResult()
    try:
        files = {n: s for n, s in walk_files(ck.storage, ck.rel).items() if n.endswith(TENSOR_SUFFIXES)
                 and (ck.only is None or n == ck.only)}
    except TreeLimit as exc:  # fail closed: what was not walked is not scanned
        eng.emit("CKD901", Hit(ck.display, f"--deep: {exc}", details={"limit": str(exc)}))
        return res
    why = None
    if files and not ck.storage.local:
        why = "reads local files only"
    elif files:
        try:
            import numpy  # noqa: F401
        except ImportError:
            why = "needs numpy (pip install 'ckptdoctor[deep]')"
    if why:  # fail closed: what was asked for and not scanned is not "fine"
        for n in sorted(files):
            eng.emit("CKD901", Hit(ck.path(n), f"--deep {why}: {n} was not scanned", details={"file": n}))
        res.skipped += sorted(files)
        return res
    k, n = eng.opt("slice", (0, 1))
    mine = _partition(files, k, n)
    covered = _structurally_checked(ck)
    plan: list[tuple[str, list[Record]]] = []
    for name in mine:
        recs = _records(ck, name, files[name], covered, res, eng)
        if recs is not None:
            plan.append((name, recs))
    res.units, res.bytes = len(plan), sum(files[n] for n, _ in plan)
    res.records = sum(len(r) for _, r in plan)
    prog = eng.progress(res.bytes, f"scanning {ck.name}")
    try:
        _run(ck, plan, files, res, prog)
    finally:
        prog.close()
    return res


def _partition(files: dict[str, int], k: int, n: int) -> list[str]:
    """Slice k of n by whole files, largest first to the least-loaded slice (deterministic)."""
    loads, mine = [0] * n, []
    for name, size in sorted(files.items(), key=lambda t: (-t[1], t[0])):
        i = min(range(n), key=lambda j: (loads[j], j))
        loads[i] += size
        if i == k:
            mine.append(name)
    return sorted(mine)


def _structurally_checked(ck) -> set[str]:
    """Archives whose damaged directory a structural rule already names (CKD117)."""
    lay = ck.layout
    return {e.name for e in ck.matching(lay.optional_archives)} if lay else set()


# ---- records of each format ---------------------------------------------------------------------
def _records(ck, name: str, size: int, covered: set[str], res: DeepResult, eng) -> list[Record] | None:
    rel = ck.relpath(name)
    read = lambda off, n: ck.storage.read_range(rel, off, n)  # noqa: E731
    try:
        if name.endswith(".safetensors"):
            try:
                hdr = stf.read_header(read, size)
            except stf.HeaderError:
                return None  # CKD120 names it
            base = 8 + hdr.size
            return [Record(name, t, base + b, base + e, d if d in FLOATS else None)
                    for t, (d, _s, b, e) in hdr.tensors.items() if e > b]
        if name.endswith(".distcp"):
            return _dcp_records(ck, name, size, read, res, eng)
        head = read(0, 4) if size else b""
        if head != ptzip.LOCAL_HEADER:
            if size:  # a legacy pickle, or not torch's at all: its bytes cannot be judged
                res.skipped.append(name)
                eng.emit("CKD901", Hit(ck.path(name), f"--deep cannot read {name}: not a torch zip archive "
                                       f"(starts with {head.hex()})", details={"file": name},
                                       hint="pre-1.6 torch.save files and other formats are not scanned"))
            return None
        return _archive_records(name, size, read, covered, res)
    except OSError as exc:
        res.skipped.append(name)
        eng.emit("CKD901", Hit(ck.path(name), f"--deep cannot read {name}: {exc.strerror or exc}",
                               details={"file": name}))
        return None


def _members(name: str, read, base: int, length: int, what: str, res: DeepResult | None):
    try:
        return ptzip.members(read, base, length)
    except ptzip.ZipDirError as exc:
        if res is not None:
            res.unreadable.append({"file": name, "record": what, "why": str(exc)})
        return None


def _member_records(name: str, label: str, ms, info_of) -> list[Record]:
    """Records of an archive's stored members; `info_of(storage key)` -> (dtype, where in the state)."""
    out = []
    for m in ms:
        if m.method != STORED:  # not torch's writer; its CRC is over inflated bytes we do not inflate
            continue
        key = m.name.rsplit("/data/", 1)[-1] if "/data/" in m.name else None
        dtype, where = info_of(key) if key is not None else (None, None)
        shown = f"{label}{where} ({m.name})" if where else f"{label}{m.name}"
        out.append(Record(name, shown, m.start, m.start + m.size, TORCH_FLOATS.get(dtype or ""), m.crc or None))
    return out  # a CRC of 0 means "not computed" (torch's compute_crc32=False); never compared


def _archive_records(name: str, size: int, read, covered: set[str], res: DeepResult) -> list[Record] | None:
    ms = _members(name, read, 0, size, "archive", None if name in covered else res)
    if ms is None:
        return None
    pkl = [m for m in ms if m.name.endswith("data.pkl")]
    infos = {}
    if pkl and pkl[0].method == STORED and pkl[0].size <= 256 << 20:
        from ..io import ptfile
        try:
            infos = ptfile.storages(read(pkl[0].start, pkl[0].size))
        except (ptfile.RefusedGlobal, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                IndexError, KeyError, OverflowError, MemoryError, RecursionError, UnicodeDecodeError):
            infos = {}  # the CRCs are still checked; NaN needs the dtype

    def info_of(key):
        i = infos.get(key)
        return (i.dtype, i.path) if i else (None, None)
    return _member_records(name, "", ms, info_of)


def _dcp_records(ck, name: str, size: int, read, res: DeepResult, eng) -> list[Record]:
    md = ck.dcp.metadata
    if md is None:
        return []  # CKD101/CKD102 report the missing or unreadable metadata
    out: list[Record] = []
    transformed = [s for s in md.storage if s.relative_path == name and s.transforms]
    if transformed:  # compressed by a storage extension: not scanned here, and not passed either
        res.skipped.append(name)
        eng.emit("CKD901", Hit(ck.path(name), f"--deep: {len(transformed)} record(s) of {name} are written through "
                                              f"{transformed[0].transforms[0]!r}; their bytes were not scanned",
                               details={"file": name, "records": len(transformed),
                                        "transform": transformed[0].transforms[0]},
                               hint="structural checks validated their frames; --deep does not decompress"))
    for s in md.storage:
        if s.relative_path != name or s.file_offset + s.length > size or s.transforms:
            continue  # CKD104 reports a record past the end of its file
        info = md.tensors.get(s.fqn)
        if ptzip.slice_problem(read, s.file_offset, s.length):
            continue  # CKD105 names it (or a storage extension wrote it: not a zip)
        label = f"{s.fqn}{list(s.offset) if s.offset else ''}: "
        ms = _members(name, read, s.file_offset, s.length, label.strip(), res)
        if ms is None:
            continue
        dt = (info.dtype or "").removeprefix("torch.") if info else None
        out += _member_records(name, label, ms, lambda _key, dt=dt: (dt, None))
    return out


# ---- the scan ------------------------------------------------------------------------------------
def _run(ck, plan, files, res: DeepResult, prog) -> None:
    import numpy as np
    threads = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                         8, sum(len(r) for _, r in plan) or 1))
    local = threading.local()  # one window buffer per thread

    def one(args):
        name, fd, rec = args
        if not hasattr(local, "buf"):
            local.buf = aligned_buffer(WINDOW)
        return name, rec, _scan_record(np, fd, rec, local.buf)

    fds: dict[str, int] = {}
    try:
        work = []
        for name, recs in plan:
            try:
                fds[name] = open_regular(ck.storage.abspath(ck.relpath(name)))
            except (NotRegularFile, OSError):
                continue  # listed a moment ago; the structural checks report what it is now
            work += [(name, fds[name], r) for r in sorted(recs, key=lambda r: r.start)]
        with ThreadPoolExecutor(threads) as ex:
            for name, rec, got in ex.map(one, work):
                prog(rec.end - rec.start)
                _judge(res, rec, got)
        for name, _recs in plan:
            if name in fds:
                _zero_tail_of(np, fds[name], files[name], name, _recs, res)
    finally:
        for fd in fds.values():
            os.close(fd)


def _judge(res: DeepResult, rec: Record, got: RecordScan) -> None:
    if rec.dtype == "F8_E4M3":  # no Inf in E4M3: S.1111.111 (the mask) is its only NaN
        got.nan, got.inf = got.nan + got.inf, 0
    if got.nan or got.inf:
        res.nonfinite.append({"file": rec.file, "tensor": rec.name, "dtype": rec.dtype, "nan": got.nan,
                              "inf": got.inf})
    if rec.crc is not None and not got.short and got.crc != rec.crc:
        res.bad_crc.append({"file": rec.file, "record": rec.name, "start": rec.start, "end": rec.end,
                            "expected": f"{rec.crc:08x}", "actual": f"{got.crc:08x}"})


def _scan_record(np, fd: int, rec: Record, buf: memoryview) -> RecordScan:
    """One pass over the record's bytes: CRC-32 and NaN/Inf counts, one window at a time."""
    out = RecordScan(crc=0 if rec.crc is not None else None)
    width, expo, mant = FLOATS[rec.dtype] if rec.dtype else (0, 0, 0)
    for off in range(rec.start, rec.end, WINDOW):
        want = min(WINDOW, rec.end - off)
        got = os.preadv(fd, [buf[:want]], off)
        if got < want:
            out.short = True
        chunk = buf[:got]
        if out.crc is not None:
            out.crc = CRC32(chunk, out.crc)
        if width and got >= width and not _all_finite(np, chunk, rec.dtype, got // width, expo):
            arr = np.frombuffer(chunk, dtype=UINT[width], count=got // width)
            bad = (arr & expo) == expo  # the slow count, only for a window that has one
            m = (arr[bad] & mant) != 0
            n = int(m.sum())
            out.nan += n
            out.inf += int(m.size) - n
            del arr, bad, m
        if out.short:
            break
    return out


def _all_finite(np, chunk, dtype: str, count: int, expo: int) -> bool:
    native = NATIVE.get(dtype)
    if native:
        return bool(np.isfinite(np.frombuffer(chunk, dtype=native, count=count)).all())
    arr = np.frombuffer(chunk, dtype=UINT[FLOATS[dtype][0]], count=count)
    return int((arr & expo).max()) != expo  # masked values never exceed the mask


def _zero_tail_of(np, fd: int, size: int, name: str, recs: list[Record], res: DeepResult) -> None:
    tail = _zero_tail(fd, size)
    if tail is None:
        return
    owner = next((r for r in recs if r.start <= tail < r.end), None)
    if owner is not None and _any_nonzero(fd, owner.start, tail):
        res.zero_tails.append({"file": name, "tensor": owner.name, "start": tail, "end": size})


def _any_nonzero(fd: int, start: int, end: int) -> bool:
    """Is any byte in [start, end) non-zero?  One bounded window at a time."""
    for off in range(start, end, WINDOW):
        if any(os.pread(fd, min(WINDOW, end - off), off)):
            return True
    return False


def _zero_tail(fd: int, size: int) -> int | None:
    """Start of the 4 KiB-aligned all-zero run that reaches the end of the file (at least one whole
    page), or None."""
    end = size
    pos = (size // PAGE) * PAGE
    if pos == size:
        pos -= PAGE
    first = None
    while pos >= 0:
        if any(os.pread(fd, end - pos, pos)):
            break
        first, end = pos, pos
        pos -= PAGE
    if first is None or size - first < PAGE:
        return None
    return first
