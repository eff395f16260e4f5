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

Speed: a scan of FORK_MIN bytes or more, from a process that runs one thread (the CLI), runs in
forked workers, one per core, that read the page cache through mmap: no copy, and no GIL shared.
Otherwise records are read with pread into one 1 MiB buffer per thread (the window stays in cache
for the CRC and the NaN test).  Not mmap in this process: a shard truncated while it is mapped
kills the process that touches it with SIGBUS, where pread returns a short read we report; a worker
that dies so loses only its unreported records, which this process then reads with pread.  On
this project's 2-core VM (AMD EPYC, AVX2, no AVX-512) ISA-L's CRC-32 (the `deep` extra) runs at
9-11 GB/s per core, zlib's at 2.3, and the copy pread makes costs about as much: the workers save
it (whole `verify --deep` of 2 GiB, alternating with the pread threads: DCP 0.62-0.70 s against
0.92-0.97, safetensors 0.44-0.52 against 0.67-0.90; benchmarks/README.md, session 9).  Memory: one
buffer per thread, at most MAP_CHUNK mapped per worker.
"""
from __future__ import annotations

import mmap
import os
import pickle
import struct
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from ..values import value, field

from ..engine.finding import Hit
from ..io.fs import NotRegularFile, ShardReader, TreeLimit, aligned_buffer, open_regular, walk_files
from ..layouts import ptzip
from .verify_dcp import storage_by_file
from ..layouts import safetensors as stf

WINDOW = 1 << 20   # bytes per read per thread (a multiple of every element width); measured on 2 GiB
                   # page-cached: 1 MiB 16.5 GB/s (DCP), 256 KiB 12.0, 4 MiB 15.8, 16 MiB 6.5
PAGE = 4096
# Large scans run in forked worker processes that read the page cache through mmap, no copy: the scan
# loop alone over 1 GiB of DCP page-cached, 2 cores, 9.2-10.3 GB/s against 5.8-7.3 for pread threads
# (cat: 8.0-9.5).  Not
# mmap in this process: a file truncated under a mapping kills the process touching it with SIGBUS;
# a worker that dies so only loses its unreported records, which this process then reads with pread
# (short reads, reported).  Below FORK_MIN forking costs more than it saves.
# Records listed and scanned at a time: all of a 1M-record checkpoint's 7M archive members at once
# (name, offsets, CRC and scan result each) peaked at 6.1 GB
GROUP_RECORDS = 200_000
FORK_MIN = 64 << 20
MAP_CHUNK = 64 << 20  # bytes a worker maps at a time: its mapped pages stay bounded
_MSG = struct.Struct("<BIqqqqq")  # kind (0 progress, 1 result), index, nan|bytes, inf, crc, upto (-1: whole),
#                                  first bad element (-1: none)
# dtype -> (element bytes, exponent-all-ones mask, mantissa mask); a value is non-finite when its
# exponent bits are all ones (F8_E4M3 has no Inf: only S.1111.111 is NaN)
FLOATS = {"F64": (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF), "F32": (4, 0x7F800000, 0x007FFFFF),
          "F16": (2, 0x7C00, 0x03FF), "BF16": (2, 0x7F80, 0x007F), "F8_E5M2": (1, 0x7C, 0x03),
          "F8_E4M3": (1, 0x7F, 0x00)}
# torch's names (DCP metadata says "torch.float32", a storage class says "float32") -> ours
TORCH_FLOATS = {"float64": "F64", "double": "F64", "float32": "F32", "float": "F32", "float16": "F16",
                "half": "F16", "bfloat16": "BF16", "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3"}
UINT = {8: "<u8", 4: "<u4", 2: "<u2", 1: "u1"}
SINT = {8: "<i8", 4: "<i4", 2: "<i2", 1: "i1"}
# numpy's isfinite, where it beats the two maxima of _all_finite (1 MiB in cache, numpy 2.4): F32 22
# against 20 GB/s, F64 32 against 21.  Not F16: numpy's isfinite converts it, 0.9 GB/s against 45.
NATIVE = {"F64": "<f8", "F32": "<f4"}
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


@value(frozen=True)
class Record:
    """A byte range of one file that holds one tensor (or one archive member)."""
    file: str
    name: str
    start: int
    end: int
    dtype: str | None = None   # one of FLOATS, or None: no NaN test
    crc: int | None = None     # the CRC-32 the archive stored, or None: nothing to compare
    shape: tuple | None = None   # the stored block's shape (row-major), when known
    origin: tuple | None = None  # where the block starts in the whole tensor (a DCP chunk's offset)
    tensor: str | None = None    # the tensor's own name, for element coordinates


@value
class RecordScan:
    nan: int = 0
    inf: int = 0
    crc: int | None = None      # computed, when the record has one to compare
    short: bool = False         # the file ended before the record did...
    upto: int = 0               # ...at this byte
    first: int | None = None    # flat index (in the record) of the first NaN/Inf element


@value
class DeepResult:
    nonfinite: list[dict] = field(default_factory=list)    # {file, tensor, dtype, nan, inf}
    zero_tails: list[dict] = field(default_factory=list)   # {file, tensor, start, end}
    bad_crc: list[dict] = field(default_factory=list)      # {file, record, expected, actual}
    unreadable: list[dict] = field(default_factory=list)   # {file, why}: archive directory damaged
    skipped: list[str] = field(default_factory=list)       # files not scanned (reported as CKD901)
    changed: list[dict] = field(default_factory=list)      # {file, record, start, end, size}: file shrank
    units: int = 0                                          # files scanned by this process (--slice)
    bytes: int = 0


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
        import importlib.util  # numpy itself is imported by _run, without its thread pool (see _numpy)
        if importlib.util.find_spec("numpy") is None:
            why = "needs numpy (pip install 'ckptdoctor[deep]')"
    if why:  # fail closed: what was asked for and not scanned is not "fine"
        for n in sorted(files):
            eng.emit("CKD901", Hit(ck.path(n), f"--deep {why}: {n} was not scanned", details={"file": n}))
        res.skipped += sorted(files)
        return res
    k, n = eng.opt("slice", (0, 1))
    mine = _partition(files, k, n)
    covered = _structurally_checked(ck)
    prog = eng.progress(sum(files[n] for n in mine), f"scanning {ck.name}")
    try:  # files are listed and scanned GROUP_RECORDS records at a time, so memory stays bounded
        plan: list[tuple[str, list[Record]]] = []
        count = 0
        for name in mine:
            recs = _records(ck, name, files[name], covered, res, eng)
            if recs is None:
                continue
            plan.append((name, recs))
            res.units, res.bytes = res.units + 1, res.bytes + files[name]
            count += len(recs)
            if count >= GROUP_RECORDS:
                _run(ck, plan, files, res, prog)
                plan, count = [], 0
        if plan:
            _run(ck, plan, files, res, prog)
    finally:
        prog.close()
        ck.results.pop("deep_reader", None)  # its buffer (up to 64 MiB) is not kept per checkpoint
    firsts = {}
    for d in res.changed:  # fail closed: bytes that vanished under the scan were not judged
        firsts.setdefault(d["file"], d)
    for d in firsts.values():
        eng.emit("CKD901", Hit(ck.path(d["file"]), f"--deep: {d['file']} ended at byte {d['size']} while it was "
                                                   f"scanned, inside record {d['record']} (bytes {d['start']}-"
                                                   f"{d['end']}); the rest was not scanned",
                               details=d, hint="the file shrank after it was listed: is something still writing "
                                               "this checkpoint? verify again once it is finished"))
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
    fd = -1
    try:
        if ck.storage.local:  # one open file for all of its records (a shard of a 1M-record
            # checkpoint holds ~2k: an open() per read was most of listing them), read whole when small
            fd = open_regular(ck.storage.abspath(rel))
            reader = ck.results.setdefault("deep_reader", ShardReader())  # one buffer for every shard
            many = len(storage_by_file(ck).get(name, ())) if name.endswith(".distcp") and ck.dcp.metadata else 1
            reader.open(fd, size, many)
            read = reader.read
        else:
            read = lambda off, n: ck.storage.read_range(rel, off, n)  # noqa: E731
        return _records_of(ck, name, size, read, covered, res, eng)
    except OSError as exc:
        res.skipped.append(name)
        eng.emit("CKD901", Hit(ck.path(name), f"--deep cannot read {name}: {exc.strerror or exc}",
                               details={"file": name}))
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _records_of(ck, name: str, size: int, read, covered: set[str], res: DeepResult, eng) -> list[Record] | None:
    if name.endswith(".safetensors"):
        try:
            hdr = stf.read_header(read, size)
        except stf.HeaderError:
            return None  # CKD120 names it
        base = 8 + hdr.size
        return [Record(name, t, base + b, base + e, d if d in FLOATS else None, shape=tuple(sh or ()),
                       origin=tuple(0 for _ in sh or ()), tensor=t)
                for t, (d, sh, b, e) in hdr.tensors.items() if e > b]
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
    want = ptzip.pickle_name([m.name for m in ms])
    pkl = next((m for m in ms if m.name == want), None)
    infos = {}
    from ..io import ptfile
    if pkl is not None and pkl.method == STORED and pkl.size <= ptfile.MAX_PICKLE_BYTES:  # read whole: bounded
        try:
            infos = ptfile.storages(read(pkl.start, pkl.size))
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
    mine = storage_by_file(ck).get(name, ())
    transformed = [s for s in mine if s.transforms]
    if transformed:  # compressed by a storage extension: not scanned here, and not passed either
        res.skipped.append(name)
        chain = transformed[0].transforms  # the storage extensions in the order the save applied them
        eng.emit("CKD901", Hit(ck.path(name), f"--deep: {len(transformed)} record(s) of {name} are written through "
                                              f"{' then '.join(map(repr, chain))}; their bytes were not scanned",
                               details={"file": name, "records": len(transformed), "transform": chain[0],
                                        "transforms": list(chain)},
                               hint="structural checks validated their frames; --deep does not decompress"))
    for s in mine:
        if s.file_offset + s.length > size or s.transforms:
            continue  # CKD104 reports a record past the end of its file
        info = md.tensors.get(s.fqn)
        if ptzip.slice_problem(read, s.file_offset, s.length):
            continue  # CKD105 names it (or a storage extension wrote it: not a zip)
        label = f"{s.fqn}{list(s.offset) if s.offset else ''}: "
        ms = _members(name, read, s.file_offset, s.length, label.strip(), res)
        if ms is None:
            continue
        dt = (info.dtype or "").removeprefix("torch.") if info else None
        recs = _member_records(name, label, ms, lambda _key, dt=dt: (dt, None))
        size_of = {tuple(o): tuple(z) for o, z in info.chunks} if info else {}
        origin = tuple(s.offset or ())
        data = [i for i, r in enumerate(recs) if r.dtype]  # the tensor's storage member (not the pickle)
        if len(data) == 1 and info and (origin in size_of or not origin):  # element coordinates
            r = recs[data[0]]
            recs[data[0]] = Record(r.file, r.name, r.start, r.end, r.dtype, r.crc, size_of.get(origin, tuple(info.size)),
                                   origin or tuple(0 for _ in info.size), s.fqn)
        out += recs
    return out


# ---- the scan ------------------------------------------------------------------------------------
def _run(ck, plan, files, res: DeepResult, prog) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = max(1, min(cores, 8, sum(len(r) for _, r in plan) or 1))
    local = threading.local()  # one window buffer per thread

    def some(idxs):
        if not hasattr(local, "buf"):
            local.buf = aligned_buffer(WINDOW)
        return [_scan_record(np, work[i][1], work[i][2], local.buf) for i in idxs]

    fds: dict[str, int] = {}
    try:
        work = []
        for name, recs in plan:
            try:
                fds[name] = open_regular(ck.storage.abspath(ck.relpath(name)))
            except (NotRegularFile, OSError):
                continue  # listed a moment ago; the structural checks report what it is now
            work += [(name, fds[name], r) for r in sorted(recs, key=lambda r: r.start)]
        got: dict[int, RecordScan] = {}
        counted: dict[int, int] = {}  # bytes of each record the workers' progress already counted
        np = _numpy()
        if sum(r.end - r.start for _, _, r in work) >= FORK_MIN and _may_fork():
            # records a dead worker left (a SIGBUS on a file cut under its mapping, an OOM kill)
            # are read below, in this process; the signals are for the tests that cause them
            got, counted, _signals = _scan_in_workers(np, work, workers, prog)
        rest = [i for i in range(len(work)) if i not in got]
        if rest:
            with ThreadPoolExecutor(workers) as ex:  # the records no worker reported, or all of them
                for idxs, scans in zip(*_batched(ex, some, rest, work)):
                    for i, scanned in zip(idxs, scans):
                        prog(work[i][2].end - work[i][2].start - counted.get(i, 0))
                        got[i] = scanned
        for i, (name, _fd, rec) in enumerate(work):
            _judge(res, rec, got[i])
        for name, _recs in plan:
            if name in fds:
                _zero_tail_of(fds[name], files[name], name, _recs, res)
    finally:
        for fd in fds.values():
            os.close(fd)


BATCH_BYTES = 4 << 20   # records of a thread-pool task: a task per record of a few bytes (a torch
BATCH_RECORDS = 4096    # archive member) cost ~15 us of pool overhead each, 20 s at 1.4M records


def _batched(ex, fn, idxs: list[int], work):
    """(batches, their results): consecutive records, up to BATCH_BYTES or BATCH_RECORDS a task."""
    batches, cur, size = [], [], 0
    for i in idxs:
        cur.append(i)
        size += work[i][2].end - work[i][2].start
        if size >= BATCH_BYTES or len(cur) >= BATCH_RECORDS:
            batches.append(cur)
            cur, size = [], 0
    if cur:
        batches.append(cur)
    return batches, ex.map(fn, batches)


def _numpy():
    """numpy; when this import is the process's first, and the process runs one thread, without
    OpenBLAS's thread pool (it starts at import, and a second thread rules the forked workers out: see
    _may_fork).  The scan does no linear algebra; the environment is restored after the import."""
    if "numpy" in sys.modules or not _may_fork():
        import numpy
        return numpy
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy
    finally:
        if saved is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved
    return numpy


def _may_fork() -> bool:
    """Forking is safe: Linux, and this process runs one thread, by the kernel's count, which includes
    threads a library started in C (a fork copies only the calling thread, with whatever locks the
    others held; Python 3.12+ warns on it).  A process that imported numpy itself usually has more
    (OpenBLAS's pool): it scans with threads."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh.read(65536).splitlines():
                if line.startswith(b"Threads:"):
                    return int(line.split()[1]) == 1
    except (OSError, ValueError, IndexError):
        pass
    return False


def _scan_in_workers(np, work, workers: int, prog) -> tuple[dict[int, RecordScan], dict[int, int], list[int]]:
    """Scan `work` in `workers` forked processes, each reading its records through mmap.  Returns the
    scans they reported, the bytes their progress counted per record, and the signals that ended any
    of them.  A record a worker did not report (it died: SIGBUS from a file truncated under its
    mapping, a signal, an error) is absent, and the caller reads it with pread."""
    import select
    mine = _assign([r.end - r.start for _, _, r in work], workers)
    got: dict[int, RecordScan] = {}
    counted: dict[int, int] = {}
    signals: list[int] = []
    pids: dict[int, int] = {}  # read end -> pid
    try:
        for idxs in filter(None, mine):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: it never returns into the caller's code
                code = 1
                try:
                    os.close(r)
                    _worker(np, work, sorted(idxs, key=lambda i: (work[i][0], work[i][2].start)), w)
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            pids[r] = pid
        pending = {r: b"" for r in pids}
        poll = select.poll()
        for r in pids:
            poll.register(r, select.POLLIN)
        while pending:
            for r, _ev in poll.poll():
                chunk = os.read(r, 1 << 16)
                if not chunk:  # the worker is done, or dead
                    poll.unregister(r)
                    del pending[r]
                    os.close(r)
                    _pid, status = os.waitpid(pids.pop(r), 0)
                    if os.WIFSIGNALED(status):
                        signals.append(os.WTERMSIG(status))
                    continue
                buf = pending[r] + chunk
                whole = len(buf) - len(buf) % _MSG.size
                for kind, i, a, b, c, upto, first in _MSG.iter_unpack(buf[:whole]):
                    if kind:
                        got[i] = RecordScan(nan=a, inf=b, crc=c if work[i][2].crc is not None else None,
                                            short=upto >= 0, upto=max(upto, 0), first=first if first >= 0 else None)
                        left = work[i][2].end - work[i][2].start - counted.get(i, 0)
                        if left > 0:  # a small record sends its result, no progress of its own
                            prog(left)  # (counted is read only for records no worker reported)
                    else:
                        counted[i] = counted.get(i, 0) + a
                        prog(a)
                pending[r] = buf[whole:]
    finally:
        for r, pid in pids.items():  # interrupted: stop and reap the workers
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
            os.close(r)
    return got, counted, signals


def _assign(sizes: list[int], workers: int) -> list[list[int]]:
    """Record indices per worker, by bytes: largest first to the least-loaded worker (ties to the
    lower worker), so no worker is left with most of the bytes."""
    loads, mine = [0] * workers, [[] for _ in range(workers)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = loads.index(min(loads))
        loads[k] += sizes[i]
        mine[k].append(i)
    return mine


def _worker(np, work, idxs: list[int], w: int) -> None:
    """Records under a window are read with pread and their results sent in batches (a mapping and
    two pipe writes per record of a few bytes dominated a 1M-record checkpoint); large ones through
    mmap, each result sent as it is done."""
    buf, out_msgs = aligned_buffer(WINDOW), bytearray()
    for i in idxs:
        _name, fd, rec = work[i]
        if rec.end - rec.start <= WINDOW:
            out = _scan_record(np, fd, rec, buf)
        else:
            if out_msgs:
                _write_all(w, out_msgs)
                out_msgs.clear()
            out = _scan_mapped(np, fd, rec, lambda n, i=i: _write_all(w, _MSG.pack(0, i, n, 0, 0, 0, -1)))
        out_msgs += _MSG.pack(1, i, out.nan, out.inf, out.crc or 0, out.upto if out.short else -1,
                              -1 if out.first is None else out.first)
        if len(out_msgs) >= 1 << 15 or rec.end - rec.start > WINDOW:
            _write_all(w, out_msgs)
            out_msgs.clear()
    if out_msgs:
        _write_all(w, out_msgs)


def _write_all(w: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(w, view):]


def _scan_mapped(np, fd: int, rec: Record, progress) -> RecordScan:
    """_scan_record's pass, reading the page cache through a mapping of MAP_CHUNK bytes at a time."""
    out = RecordScan(crc=0 if rec.crc is not None else None)
    width, expo, mant = FLOATS[rec.dtype] if rec.dtype else (0, 0, 0)
    size = os.fstat(fd).st_size
    if size < rec.end:  # shorter than when it was listed: the bytes that are there, by pread
        return _scan_record(np, fd, rec, aligned_buffer(WINDOW))
    pos = rec.start
    while pos < rec.end:
        base = pos - pos % mmap.ALLOCATIONGRANULARITY
        stop = min(rec.end, base + MAP_CHUNK)
        m = mmap.mmap(fd, stop - base, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=base)
        view = memoryview(m)
        try:
            for off in range(pos, stop, WINDOW):
                chunk = view[off - base:min(stop, off + WINDOW) - base]
                _window(np, chunk, rec.dtype, width, expo, mant, out, (off - rec.start) // width if width else 0)
                chunk.release()
        finally:
            view.release()
            m.close()
        progress(stop - pos)
        pos = stop
    return out


def _judge(res: DeepResult, rec: Record, got: RecordScan) -> None:
    if rec.dtype == "F8_E4M3":  # no Inf in E4M3: S.1111.111 (the mask) is its only NaN
        got.nan, got.inf = got.nan + got.inf, 0
    if got.nan or got.inf:
        res.nonfinite.append({"file": rec.file, "tensor": rec.name, "dtype": rec.dtype, "nan": got.nan,
                              "inf": got.inf, "first": _where(rec, got.first)})
    if got.short:
        res.changed.append({"file": rec.file, "record": rec.name, "start": rec.start, "end": rec.end,
                            "size": got.upto})
    if rec.crc is not None and not got.short and got.crc != rec.crc:
        res.bad_crc.append({"file": rec.file, "record": rec.name, "start": rec.start, "end": rec.end,
                            "expected": f"{rec.crc:08x}", "actual": f"{got.crc:08x}"})


def _where(rec: Record, flat: int | None) -> str | None:
    """The first bad element as the whole tensor's index (`w[3, 5]`) when the block's shape and origin
    are known, else as the flat element of the stored record."""
    if flat is None:
        return None
    if rec.shape and rec.origin is not None and len(rec.origin) == len(rec.shape) and rec.tensor:
        idx, rest = [], flat
        for dim in reversed(rec.shape):
            idx.append(rest % dim if dim else 0)
            rest = rest // dim if dim else rest
        coords = [o + i for o, i in zip(rec.origin, reversed(idx))]
        return f"{rec.tensor}[{', '.join(map(str, coords))}]"
    return f"flat element {flat} of the stored record"


def _scan_record(np, fd: int, rec: Record, buf: memoryview) -> RecordScan:
    """One pass over the record's bytes: CRC-32 and NaN/Inf counts, one window at a time."""
    out = RecordScan(crc=0 if rec.crc is not None else None)
    width, expo, mant = FLOATS[rec.dtype] if rec.dtype else (0, 0, 0)
    for off in range(rec.start, rec.end, WINDOW):
        want = min(WINDOW, rec.end - off)
        got = os.preadv(fd, [buf[:want]], off)
        if got < want:
            out.short, out.upto = True, off + got
        _window(np, buf[:got], rec.dtype, width, expo, mant, out, (off - rec.start) // width if width else 0)
        if out.short:
            break
    return out


def _window(np, chunk, dtype, width: int, expo: int, mant: int, out: RecordScan, base: int = 0) -> None:
    got = len(chunk)
    if out.crc is not None:
        out.crc = CRC32(chunk, out.crc)
    if width and got >= width and not _all_finite(np, chunk, dtype, got // width, expo):
        arr = np.frombuffer(chunk, dtype=UINT[width], count=got // width)
        bad = (arr & expo) == expo  # the slow count, only for a window that has one
        if out.first is None:
            out.first = base + int(np.flatnonzero(bad)[0])
        m = (arr[bad] & mant) != 0
        n = int(m.sum())
        out.nan += n
        out.inf += int(m.size) - n
        del arr, bad, m


def _all_finite(np, chunk, dtype: str, count: int, expo: int) -> bool:
    """No element's exponent is all ones (exact; two reductions, no temporary array).  The exponent
    bits sit right below the sign, so (x & expo) == expo exactly when x without its sign is >= expo:
    a positive such x is >= expo as a signed integer, a negative one >= sign|expo as an unsigned one,
    and no other value reaches either bound.  The masked maximum it replaced ran at 15 GB/s for BF16
    (it writes a temporary), these at 45."""
    native = NATIVE.get(dtype)
    if native:
        return bool(np.isfinite(np.frombuffer(chunk, dtype=native, count=count)).all())
    width = FLOATS[dtype][0]
    return (int(np.frombuffer(chunk, dtype=SINT[width], count=count).max()) < expo
            and int(np.frombuffer(chunk, dtype=UINT[width], count=count).max()) < (1 << (8 * width - 1)) | expo)


def _zero_tail_of(fd: int, size: int, name: str, recs: list[Record], res: DeepResult) -> None:
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
        page = os.pread(fd, end - pos, pos)
        if len(page) < end - pos:
            return None  # shorter than when it was listed: missing bytes are not zeros (CKD901 names it)
        if any(page):
            break
        first, end = pos, pos
        pos -= PAGE
    if first is None or size - first < PAGE:
        return None
    return first
