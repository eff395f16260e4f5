"""One small storage interface over local paths (os, fast) and fsspec URLs (s3://, memory://...).

Verify-side code only lists, stats and reads ranges: it never writes.  Errors are mapped to the
exit-code contract here, once: a missing root is an InputError (exit 2), an unreachable store a
TransientError (exit 75).
"""
from __future__ import annotations

import errno
import mmap
import os
import posixpath
import stat as stat_mod
from ..values import value
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import IO

from ..engine.errors import InputError, TransientError

TRANSIENT_ERRNOS = {errno.ETIMEDOUT, errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH,
                    errno.ENETUNREACH, errno.EAGAIN, errno.ESTALE}


class NotRegularFile(OSError):
    """A FIFO, socket or device where a file was expected: never opened (a FIFO would block forever,
    /dev/zero would never end)."""


def aligned_buffer(size: int) -> memoryview:
    """A writable buffer that starts on a page boundary, for reads from the page cache.

    Measured on this project's machine (AMD EPYC, `rep movsb` copies): reading a page-cached file
    into a buffer whose address is 16 bytes past a 64-byte boundary runs at 1.6-1.9 GiB/s, into a
    64-byte-aligned one at 9-10 GiB/s, the speed of `cat`.  A large `bytearray` is exactly the
    slow case (glibc serves it from mmap with a 16-byte header), so every reader that copies
    page-cache bytes into a buffer (hashing, the publish copy, `--deep`) takes its buffer here:
    an anonymous mapping, page-aligned by construction."""
    return memoryview(mmap.mmap(-1, size))


def open_regular(path: str) -> int:
    """An fd for `path` only if it is a regular file (following links).  O_NONBLOCK so that opening
    a FIFO cannot block; the type is checked on the open descriptor (no race with a swap)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat_mod.S_ISFIFO(st.st_mode) else "a socket" if stat_mod.S_ISSOCK(st.st_mode)
                    else "a device" if stat_mod.S_ISCHR(st.st_mode) or stat_mod.S_ISBLK(st.st_mode)
                    else "a directory" if stat_mod.S_ISDIR(st.st_mode) else "not a regular file")
            raise NotRegularFile(errno.EINVAL, f"{kind}, not a regular file; not read", path)
        import fcntl
        # Blocking again. F_SETFL changes only O_APPEND, O_NONBLOCK, O_DIRECT, O_NOATIME and O_ASYNC,
        # and this descriptor was opened with none of them but O_NONBLOCK, so 0 clears it without
        # an F_GETFL first: one system call less per shard, and each releases the GIL to 64 workers
        # (the gate of 3 x 4,096 shards at 2 ms, latency harness: 1.42 s with both, 1.31 s now)
        fcntl.fcntl(fd, fcntl.F_SETFL, 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: int) -> bytes:
    """A whole small regular file, refusing anything that claims more than `limit` bytes."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ValueError(f"{path}: {size} bytes, larger than the {limit}-byte limit for this file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path}: larger than the {limit}-byte limit for this file")
    return data


@value(frozen=True)
class Entry:
    name: str
    size: int
    mtime: float | None
    is_dir: bool
    is_link: bool = False
    is_file: bool = True   # a regular file (False: FIFO, socket, device; or a directory)
    mtime_ns: int = 0      # local listings: exact mtime and inode, so a publish tells a rewritten or
    ino: int = 0           # replaced source file from the listing alone (no second stat per file)
    readable: bool = True  # local regular files: this process may open it (False: a load fails, CKD901)


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    name = type(exc).__name__
    return name in {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                    "ClientConnectorError", "ServerTimeoutError", "ConnectionClosedError"}


WHOLE_FILE_MAX = 64 << 20   # bytes: a shard of many small records is read once, not twice per record


class ShardReader:
    """read(offset, n) of one open shard, for the small ranges each record needs (its first 4 and
    last 98 bytes, see layouts.ptzip.slice_problem; CKD105 and --deep's record listing).  A shard
    averaging under 8 KiB per record is read whole once (at most WHOLE_FILE_MAX, so memory stays bounded): at 1M
    records two preads each cost ~3 s of system calls, a sequential read a few ms.  The whole
    reads share one page-aligned buffer: a fresh `bytes` per shard was page-faulted in again for
    every file (0.85 s in pread under cProfile, 200k records, 280 MB of page-cached shards)."""

    def __init__(self, whole_max: int = WHOLE_FILE_MAX):
        self.buf = None
        self.whole_max = whole_max
        self.fd, self.n = -1, 0   # n: bytes of the current shard in buf (-1: not read whole)

    def open(self, fd: int, size: int, records: int) -> None:
        self.fd, self.n = fd, -1
        if size <= self.whole_max and size <= 8192 * records:
            if self.buf is None or len(self.buf) < size:
                self.buf = mmap.mmap(-1, max(size, 1 << 20))
            self.n = os.preadv(fd, [memoryview(self.buf)[:size]], 0) if size else 0  # short if it
            # shrank since the listing: bytes past n are the previous shard's and are never handed out

    def read(self, off: int, n: int) -> bytes:
        if self.n < 0:
            return os.pread(self.fd, n, off)
        return self.buf[off:min(off + n, self.n)] if off < self.n else b""


class ShardReaders:
    """One ShardReader per thread that judges shards (map_io's workers, or the caller alone), for
    one check's run: together they hold at most WHOLE_FILE_MAX of whole-shard buffers (a worker's
    whole reads are capped at its share), and they are dropped with the check."""

    def __init__(self):
        self.by_thread: dict[int, ShardReader] = {}

    def mine(self) -> ShardReader:
        import threading
        me = threading.get_ident()
        r = self.by_thread.get(me)
        if r is None:
            worker = threading.current_thread().name.startswith("ckd-io")
            r = self.by_thread[me] = ShardReader(max(1 << 20, WHOLE_FILE_MAX // io_threads()) if worker
                                                 else WHOLE_FILE_MAX)
        return r


# Round trips on networked filesystems (issue 42).  On Lustre, GPFS or NFS one stat or open costs
# 0.5-5 ms, so a checkpoint of 4,096 shards statted one after another takes seconds; issued
# concurrently they take a few round trips.  On a local disk the same calls cost 2-5 us and a
# thread pool only adds overhead (measured: 4,096 stats 9 ms serially, 41 ms through a pool), so
# map_io times its first calls and goes concurrent only when they are slow.
IO_THREADS_ENV = "CKPTDOCTOR_IO_THREADS"
IO_THREADS_DEFAULT = 64     # calls in flight at once on slow storage (1: never concurrent); 64 measured
                            # 2.8 s against 32's 3.3 s for the benchmark's 3 x 4,096 shards at 2 ms
SLOW_CALL_S = 100e-6        # a metadata call slower than this is a round trip, not a cache hit
PROBE_CALLS = 16            # calls timed serially before deciding (once slow storage was seen, none)
_pool = None
_seen_slow = False


def io_threads() -> int:
    raw = os.environ.get(IO_THREADS_ENV, "")
    if raw.strip().isdigit() and raw.isascii():
        return max(1, min(int(raw), 1024))
    return IO_THREADS_DEFAULT


def _executor():
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(io_threads(), thread_name_prefix="ckd-io")
    return _pool


def shutdown_pool() -> None:
    """Stop the worker threads (a process that forks afterwards, like --deep's scan, needs to be
    single-threaded again; the next slow batch starts a new pool)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None


def map_io(fn, items, slow_s: float = SLOW_CALL_S):
    """fn(item) for each item, results in order (an exception is returned in place of its result,
    never raised here).  The first PROBE_CALLS run serially and are timed; if they average more
    than SLOW_CALL_S the rest run on a pool of io_threads() workers, in batches of 64 per worker.
    fn must return nothing that needs releasing (no open descriptor): a consumer that stops early
    drops the rest of its batch (CKD105's job opens, reads, judges and closes its shard).
    `slow_s`: the per-call time that means round trips, for an fn that does CPU work of its own (a node view: ~1 ms locally, 6 round trips on NFS).
    Called from one of the pool's own workers, it runs serially: a worker waiting on tasks queued
    behind it could deadlock the pool."""
    import threading
    import time
    global _seen_slow
    items = list(items)
    threads = io_threads() if not threading.current_thread().name.startswith("ckd-io") else 1
    spent, i = 0.0, 0   # time inside fn only: the consumer's own work between results is not a round trip
    while i < len(items):
        if threads > 1 and (_seen_slow or (i == PROBE_CALLS and spent / i > slow_s)):
            _seen_slow = True
            break
        t0 = time.perf_counter()
        res = _call(fn, items[i])
        spent += time.perf_counter() - t0
        yield res
        i += 1
    if i >= len(items):
        return
    # Concurrent in batches: the pool runs a batch while this thread waits, then the consumer works
    # through it while the pool is idle.  Interleaving the two (a sliding window) made every
    # syscall of the consumer wait for the GIL behind 32 workers: os.close went from 2 us to 75 us,
    # and 3 x 4,096 shards at 2 ms took 5.7 s instead of 3 s.  A batch waits for its slowest
    # worker, so batches are long: 64 calls per worker (the gate above: 8 per worker 1.31 s,
    # 32 1.26 s, 64 1.21 s, 128 and 256 1.20 s; the listing went from 18,000 to 25,000 stats/s).
    # The consumer holds one batch's results at a time: keep them small (CKD105 returns at most
    # five bad records per shard).
    pool, batch = _executor(), 64 * threads
    for start in range(i, len(items), batch):
        part = items[start:start + batch]
        step = -(-len(part) // threads)   # one task per worker: a future per call cost more than the call
        done = [r for rs in pool.map(_calls, [fn] * threads, [part[k:k + step] for k in range(0, len(part), step)])
                for r in rs]
        yield from done


def remove_tree(path: str) -> None:
    """shutil.rmtree with the unlinks issued together where each is a round trip (map_io: serial on
    a local disk, where an unlink costs ~10 us; concurrent on Lustre/NFS, where a 4,096-shard
    checkpoint at 2 ms per unlink took 8 s one after another).  Symlinks are removed, never
    followed; directories go bottom-up once empty.  Raises the first error other than a name that is
    already gone."""
    files, dirs = [], []
    for d, subdirs, names in os.walk(path, followlinks=False):
        dirs.append(d)
        files += [os.path.join(d, n) for n in names]
        links = [n for n in subdirs if os.path.islink(os.path.join(d, n))]   # walk lists them, never enters
        files += [os.path.join(d, n) for n in links]
    for res in map_io(os.unlink, files):
        if isinstance(res, BaseException) and not isinstance(res, FileNotFoundError):
            raise res
    for d in reversed(dirs):
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass


def _calls(fn, items):
    return [_call(fn, item) for item in items]


def _call(fn, item):
    try:
        return fn(item)
    except Exception as exc:   # handed to the consumer, which knows what a failure of this call means
        return exc


class Storage:
    """Base: paths are '/'-separated and relative to the storage root ('' is the root)."""
    display: str
    local: bool = False

    def join(self, *parts: str) -> str:
        return posixpath.join(*[p for p in parts if p]) if any(parts) else ""

    def show(self, rel: str) -> str:
        return posixpath.join(self.display, rel) if rel else self.display

    def listdir(self, rel: str = "") -> list[Entry]: raise NotImplementedError
    def list_root_first(self) -> bool: return False   # see FsspecStorage
    def stat(self, rel: str) -> Entry | None: raise NotImplementedError
    def open(self, rel: str) -> IO[bytes]: raise NotImplementedError

    def read(self, rel: str, limit: int) -> bytes:
        """Whole small file, refusing anything larger than `limit` bytes."""
        with self.open(rel) as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"larger than {limit} bytes")
        return data

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        with self.open(rel) as fh:
            fh.seek(start)
            return fh.read(length)

    def sub(self, rel: str) -> "Storage": raise NotImplementedError

    def readlink(self, rel: str) -> str:
        """Where a symbolic link points, as written (object stores have none)."""
        raise OSError(errno.EINVAL, "not a symbolic link")


class LocalStorage(Storage):
    local = True

    def __init__(self, root: str):
        self.root = root[len("file://"):] if root.startswith("file://") else root
        self.display = self.root.rstrip("/") or "/"

    def abspath(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def listdir(self, rel: str = "") -> list[Entry]:
        """One readdir, then each entry's stat (concurrent on slow storage, see map_io)."""
        with os.scandir(self.abspath(rel)) as it:
            des = list(it)
        out = []
        for res in map_io(_entry_of, des):
            if isinstance(res, BaseException):
                raise res
            if res is not None:
                out.append(res)
        return out

    def stat(self, rel: str) -> Entry | None:
        try:
            st = os.stat(self.abspath(rel))
        except FileNotFoundError:
            return None
        reg = stat_mod.S_ISREG(st.st_mode)
        return Entry(posixpath.basename(rel), st.st_size, st.st_mtime, stat_mod.S_ISDIR(st.st_mode),
                     False, reg, readable=not reg or may_read(self.abspath(rel), st))

    def open(self, rel: str) -> IO[bytes]:
        return os.fdopen(open_regular(self.abspath(rel)), "rb")

    def read(self, rel: str, limit: int) -> bytes:
        return read_regular(self.abspath(rel), limit)

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        fd = open_regular(self.abspath(rel))
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def sub(self, rel: str) -> "LocalStorage":
        return LocalStorage(self.abspath(rel))

    def readlink(self, rel: str) -> str:
        return os.readlink(self.abspath(rel))


def _entry_of(de) -> Entry | None:
    """A listed name's entry (None: it vanished since the listing)."""
    try:
        st = de.stat(follow_symlinks=True)
        is_link = de.is_symlink()
    except FileNotFoundError:  # dangling symlink or vanished while listing
        try:
            st = de.stat(follow_symlinks=False)
        except FileNotFoundError:
            return None
        is_link = True
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Entry(de.name, 0, None, False, True)
        raise
    reg = stat_mod.S_ISREG(st.st_mode)
    return Entry(de.name, st.st_size, st.st_mtime, stat_mod.S_ISDIR(st.st_mode), is_link,
                 reg, st.st_mtime_ns, st.st_ino, not reg or may_read(de.path, st))


_creds: tuple | None = None
_ACCESS_EFFECTIVE = os.access in os.supports_effective_ids   # Linux, macOS: faccessat(AT_EACCESS)


def may_read(path: str, st: os.stat_result) -> bool:
    """Whether this process may open the file for reading, judged from the stat the listing already
    made: the owner, group or other read bit that applies to it.  Only when that bit says no is the
    kernel asked (access(2) with the effective ids: root's CAP_DAC_OVERRIDE, ACLs), so a healthy
    listing costs no extra metadata call (on a 2 ms filesystem each one is a round trip).  An ACL
    that denies what the bits allow is met by the read itself."""
    global _creds
    if _creds is None:
        _creds = (os.geteuid(), frozenset((os.getegid(), *os.getgroups())))
    uid, gids = _creds
    bit = stat_mod.S_IRUSR if st.st_uid == uid else stat_mod.S_IRGRP if st.st_gid in gids else stat_mod.S_IROTH
    if st.st_mode & bit:
        return True
    try:
        return os.access(path, os.R_OK, effective_ids=_ACCESS_EFFECTIVE)
    except OSError:
        return False


class FsspecStorage(Storage):
    def __init__(self, url: str, fs=None):
        from ..engine import logs
        logs.apply()   # fsspec and its backends log through logging: in the CLI's format
        import fsspec  # lazy: 60 ms
        if fs is None:
            fs, path = fsspec.core.url_to_fs(url)
        else:
            path = fs._strip_protocol(url)
        self.fs = fs
        self.root = path.rstrip("/")
        self.url = url.rstrip("/")
        self.display = self.url
        self._root_listing: list[Entry] | None = None

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def list_root_first(self) -> bool:
        """Whether the location is a prefix with something under it, by listing it; the listing is
        kept for the first listdir(""), which every command makes next.  Asking first (`info`: a
        HEAD and a one-key LIST on S3) cost two round trips before that same listing (issue 42's
        harness: the gate's requests on a run root went from HEAD 1, LIST 17 to HEAD 0, LIST 16)."""
        try:
            listed = self.listdir("")
        except (FileNotFoundError, NotADirectoryError):   # asked again below, to say which
            return False
        self._root_listing = listed or None
        return bool(listed)

    def listdir(self, rel: str = "") -> list[Entry]:
        if not rel and self._root_listing is not None:
            listed, self._root_listing = self._root_listing, None
            return listed
        base = self._p(rel)
        items = self.fs.ls(base, detail=True, refresh=True) if _supports_refresh(self.fs) else \
            self.fs.ls(base, detail=True)
        out = []
        for it in items:
            name = it["name"].rstrip("/").rsplit("/", 1)[-1]
            if it["name"].rstrip("/") == base.rstrip("/"):
                continue
            is_dir = it.get("type") == "directory"
            out.append(Entry(name, int(it.get("size") or 0), _mtime(it), is_dir, False, not is_dir))
        return out

    def stat(self, rel: str) -> Entry | None:
        try:
            it = self.fs.info(self._p(rel))
        except FileNotFoundError:
            return None
        is_dir = it.get("type") == "directory"
        return Entry(posixpath.basename(rel), int(it.get("size") or 0), _mtime(it), is_dir, False, not is_dir)

    def open(self, rel: str) -> IO[bytes]:
        return self.fs.open(self._p(rel), "rb")

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        return self.fs.cat_file(self._p(rel), start=start, end=start + length)

    def sub(self, rel: str) -> "FsspecStorage":
        return FsspecStorage(f"{self.url}/{rel}", fs=self.fs)


# The one tree walker (checksums, manifest, preflight read sets, publish).  Checkpoints are a few
# levels deep; the caps exist only so a hostile tree (a 1,500-deep chain, millions of empty
# files) cannot exhaust memory or time, and hitting one is an error the caller reports.
MAX_TREE_DEPTH = 64
MAX_TREE_ENTRIES = 4_000_000


class TreeLimit(OSError):
    """A walk stopped at a safety cap: what lies beyond was not seen."""


@value
class Tree:
    dirs: list[str]
    files: dict[str, Entry]     # relative path ('/'-separated) -> entry (anything not a directory)
    dir_links: list[str]        # symlinks to directories: listed, never followed

    def sizes(self) -> dict[str, int]:
        return {r: e.size for r, e in self.files.items()}


def walk(st: Storage, rel: str = "", top: "list[Entry] | None" = None) -> Tree:
    """Every directory and non-directory below `rel`, paths relative to it.  Listing errors are
    raised (never skipped); symlinked directories are not followed (reported as entries).  `top`:
    the listing of `rel` itself when the caller already holds it (not listed twice: on a networked
    filesystem every entry's stat is a round trip)."""
    tree = Tree([], {}, [])
    stack = [("", 0)]
    seen = 0
    while stack:
        sub, depth = stack.pop()
        listed = top if (top is not None and sub == "") else st.listdir(st.join(rel, sub))
        for e in sorted(listed, key=lambda e: e.name):
            seen += 1
            if seen > MAX_TREE_ENTRIES:
                raise TreeLimit(f"{st.show(rel)}: more than {MAX_TREE_ENTRIES} entries; not walked further")
            p = f"{sub}/{e.name}" if sub else e.name
            if e.is_dir and e.is_link:
                tree.dir_links.append(p)
            elif e.is_dir:
                if depth + 1 > MAX_TREE_DEPTH:
                    raise TreeLimit(f"{st.show(st.join(rel, p))}: directory tree deeper than {MAX_TREE_DEPTH} "
                                    f"levels; not walked further")
                tree.dirs.append(p)
                stack.append((p, depth + 1))
            else:
                tree.files[p] = e
    tree.dirs.sort()
    return tree


def walk_files(st: Storage, rel: str = "", top: "list[Entry] | None" = None) -> dict[str, int]:
    return walk(st, rel, top).sizes()


def _supports_refresh(fs) -> bool:
    return type(fs).__module__.startswith("s3fs")


def _mtime(info: dict) -> float | None:
    for key in ("mtime", "LastModified", "last_modified", "created"):
        v = info.get(key)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            return v.timestamp()
        try:
            return float(v)
        except (TypeError, ValueError):
            continue
    return None


# fsspec protocol -> the extra that installs its driver (pyproject.toml [project.optional-dependencies])
EXTRAS = {"s3": ("s3", "s3fs"), "s3a": ("s3", "s3fs"), "gs": ("gcs", "gcsfs"), "gcs": ("gcs", "gcsfs"),
          "sftp": ("sftp", "paramiko"), "ssh": ("sftp", "paramiko")}


def install_hint(location: str) -> str:
    proto = location.split("://", 1)[0].lower() if "://" in location else ""
    extra, pkg = EXTRAS.get(proto, (None, None))
    if extra:
        return f"install it: pip install 'ckptdoctor[{extra}]' (brings {pkg})"
    return f"install the fsspec driver for {proto}:// (see fsspec's list of known implementations)"


def open_location(location: str) -> Storage:
    """Open a checkpoint location; raise InputError (exit 2) or TransientError (exit 75)."""
    try:
        st: Storage = FsspecStorage(location) if is_url(location) else LocalStorage(location)
        if st.list_root_first():
            return st
        root = st.stat("")
    except ImportError as exc:
        raise InputError(f"{location}: no filesystem driver for this URL ({exc.name or exc}); "
                         f"{install_hint(location)}") from None
    except ValueError as exc:
        raise InputError(f"{location}: {exc}") from None
    except PermissionError:
        raise InputError(f"{location}: permission denied") from None
    except Exception as exc:
        if is_transient(exc):
            raise TransientError(f"{location}: storage unreachable: {exc}") from None
        raise
    if root is None:
        # object stores: a prefix with children but no directory object still counts
        if not st.local:
            try:
                if st.listdir(""):
                    return st
            except FileNotFoundError:
                pass
            except Exception as exc:
                if is_transient(exc):
                    raise TransientError(f"{location}: storage unreachable: {exc}") from None
                raise
        raise InputError(f"{location}: no such file or directory")
    if not root.is_dir:
        raise InputError(f"{location}: not a directory (give a checkpoint directory or a run root)")
    if st.local and not os.access(st.abspath(""), os.R_OK | os.X_OK):
        raise InputError(f"{location}: permission denied")
    return st
