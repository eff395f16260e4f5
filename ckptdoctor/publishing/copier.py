"""Copy a checkpoint's files while hashing them: each byte is read once, written once, hashed once.

Files are copied by a thread pool (read/write/fsync and xxh3 for large buffers release the GIL),
each worker with its own read buffer (io.hashing.BUF_BYTES).  Digests follow the manifest's rule (one xxh3-128 per
64 MiB range), so the manifest comes out of the copy for free.  A source file whose size or
mtime moves while it is copied aborts the publish (SourceChanged): copying a checkpoint that is
still being written is how half-written checkpoints get published.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from ..values import value

import xxhash

from ..io.hashing import CHUNK_BYTES, _buf
from . import faults


class SourceChanged(OSError):
    pass


# Parallel copies, whatever the core count: a copy thread spends its time in read, write and
# fsync with the GIL released, and the disk finishes sooner with more files' writeback in flight.
# Measured on this project's 2-core VM (4 GiB in 16 files, copy + per-file fsync, 5 alternating
# rounds): 4 threads 1.84-2.55 s, 8 threads 1.47-1.97 s, 16 threads 1.39-1.50 s, against `cp -r`
# + `sync` 1.66-1.97 s.  Each thread holds one 512 KiB buffer.
COPY_WORKERS = 16


def copy_workers(workers: int | None, nfiles: int) -> int:
    """Threads for copying or uploading `nfiles` files: `workers` if given, else up to 16."""
    return max(1, workers or min(COPY_WORKERS, nfiles))


@value
class Copied:
    rel: str
    size: int
    digests: list[str]


class ChunkDigests:
    """xxh3-128 per `chunk` bytes of a stream, the manifest's digests.  Callers read at most
    `want(n)` bytes at a time, so no update straddles a chunk boundary."""

    def __init__(self, chunk: int = CHUNK_BYTES):
        self.chunk, self.left, self.total = chunk, chunk, 0
        self.h = xxhash.xxh3_128()
        self.digests: list[str] = []

    def want(self, cap: int) -> int:
        return min(cap, self.left)

    def update(self, data) -> None:
        self.h.update(data)
        self.total += len(data)
        self.left -= len(data)
        if self.left == 0:
            self.digests.append(self.h.hexdigest())
            self.h, self.left = xxhash.xxh3_128(), self.chunk

    def feed(self, data) -> None:
        """update() with any length: split at the chunk boundaries (for callers that do not choose
        how much arrives, e.g. a stream someone else writes through)."""
        mv = memoryview(data).cast("B")
        done = 0
        while done < len(mv):
            take = self.want(len(mv) - done)
            self.update(mv[done:done + take])
            done += take

    def finish(self) -> list[str]:
        if self.total == 0 or self.total % self.chunk:
            self.digests.append(self.h.hexdigest())
        return self.digests


def source_tree(src: str, top=None):
    """One walk of a local source: every publish decision about it (what to copy, whether it changed
    meanwhile) reads this listing, so each file is statted once per walk (concurrently where a stat
    is a round trip), never again one by one.  `top`: the source's own listing when the caller
    already holds it (the verify of the source made it)."""
    from ..io.fs import LocalStorage, walk
    return walk(LocalStorage(src), top=top)


def list_tree(src: str, tree=None) -> tuple[list[str], dict[str, int]]:
    """(directories, files -> size) under src, relative with '/'.  Symlinks and anything that is not
    a regular file are refused; a directory that cannot be listed aborts (never skipped)."""
    tree = tree or source_tree(src)
    for rel in tree.dir_links:
        raise OSError(f"{os.path.join(src, rel)}: symlink inside the checkpoint; publish copies only real files")
    files = {}
    for rel, e in tree.files.items():
        if e.is_link:
            raise OSError(f"{os.path.join(src, rel)}: symlink inside the checkpoint; publish copies only real files")
        if not e.is_file:
            raise OSError(f"{os.path.join(src, rel)}: not a regular file")
        files[rel] = e.size
    return tree.dirs, files


def snapshot(src: str, tree=None) -> dict[str, tuple[int, int, int]]:
    """Every file under src: (size, mtime_ns, inode), to tell whether the source changed between
    listing and commit (a file rewritten, replaced, added or removed while other files were copied).
    From the walk's own stats: at 2 ms per call a second lstat per file, one after another, cost
    4.1 s of a 1,024-shard publish (benchmarks/latency_bench.py publish)."""
    tree = tree or source_tree(src)
    return {rel: (e.size, e.mtime_ns, e.ino) for rel, e in tree.files.items()}


def snapshot_diff(before: dict, after: dict) -> str | None:
    """One line naming what differs, or None."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(r for r in set(before) & set(after) if before[r] != after[r])
    parts = [f"{what} {', '.join(xs[:3])}" + (f" (+{len(xs) - 3} more)" if len(xs) > 3 else "")
             for what, xs in (("added", added), ("removed", removed), ("rewritten", changed)) if xs]
    return "; ".join(parts) or None


CANCEL = threading.Event()  # set on SIGINT/SIGTERM: every copy stops at its next buffer


class Cancelled(Exception):
    """The copy was cancelled (an interrupt); the caller removes what it staged."""


def copy_file(src: str, dst: str, rel: str, chunk: int = CHUNK_BYTES, progress=None) -> Copied:
    buf = _buf()
    cd = ChunkDigests(chunk)
    with open(src, "rb") as fi:
        # the open file's own attributes: the file read is the file judged, and no path lookup (a
        # round trip each on a networked filesystem) before or after; a source replaced by a rename
        # meanwhile is what the publish's second walk of the source catches (snapshot_diff)
        st0 = os.fstat(fi.fileno())
        try:
            os.posix_fadvise(fi.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, st0.st_mode & 0o777 | 0o200)
        try:
            while True:
                if CANCEL.is_set():
                    raise Cancelled(f"{rel}: copy cancelled")
                try:
                    n = fi.readinto(buf[:cd.want(len(buf))])
                except OSError as exc:
                    raise _named(exc, src) from None
                if not n:
                    break
                view = buf[:n]
                faults.wrote(n)
                written = 0
                try:
                    while written < n:
                        written += os.write(fd, view[written:])
                except OSError as exc:  # ENOSPC, EDQUOT, EIO
                    raise _named(exc, dst) from None
                cd.update(view)
                if progress:
                    progress(n)
            st1 = os.fstat(fi.fileno())
            if cd.total != st0.st_size or (st1.st_size, st1.st_mtime_ns) != (st0.st_size, st0.st_mtime_ns):
                raise SourceChanged(f"{src}: changed while being copied (size {st0.st_size} -> {st1.st_size}, "
                                    f"read {cd.total}); is the checkpoint still being written?")
            os.utime(fd, ns=(st0.st_atime_ns, st0.st_mtime_ns))  # keep 'marker written last' evidence
            try:
                os.fsync(fd)  # EIO of a failed writeback surfaces here, before anything names the file
            except OSError as exc:
                raise _named(exc, dst) from None
        finally:
            os.close(fd)
    return Copied(rel, cd.total, cd.finish())


def _named(exc: OSError, path: str) -> OSError:
    """The same error naming the file: "[Errno 5] Input/output error" alone does not say which."""
    return exc if exc.filename else OSError(exc.errno, exc.strerror, path)


def copy_tree(src: str, dst: str, dirs: list[str], files: dict[str, int], workers: int | None = None,
              progress=None, chunk: int = CHUNK_BYTES) -> dict[str, Copied]:
    for d in dirs:
        os.makedirs(os.path.join(dst, d), exist_ok=True)
    # largest first, so one big shard does not start last and set the wall time
    order = sorted(files, key=lambda r: -files[r])
    workers = copy_workers(workers, len(order))
    out: dict[str, Copied] = {}
    first = True
    if workers <= 1 or len(order) <= 1:
        for rel in order:
            out[rel] = copy_file(os.path.join(src, rel), os.path.join(dst, rel), rel, chunk, progress)
            if first:
                faults.point("copy")
                first = False
        return out
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckd-copy") as ex:
        futs = {rel: ex.submit(copy_file, os.path.join(src, rel), os.path.join(dst, rel), rel, chunk, progress)
                for rel in order}
        return gather(futs, after_first=lambda: faults.point("copy"))


def gather(futs: dict, after_first=None) -> dict:
    """Every future's result, by key.  An interrupt stops at once (CANCEL set, pending ones
    cancelled); any other error is raised, the first one, after the rest have finished, so no
    worker is still writing when the caller cleans up."""
    out, errors = {}, []
    for key, f in futs.items():
        try:
            out[key] = f.result()
        except (KeyboardInterrupt, SystemExit):
            CANCEL.set()
            for g in futs.values():
                g.cancel()
            raise
        except BaseException as exc:
            errors.append(exc)
        if after_first is not None:
            after_first()
            after_first = None
    if errors:
        raise errors[0]
    return out


def upload_file(fs, src: str, target: str, rel: str, progress=None) -> Copied:
    """Stream one local file to an fsspec object while hashing it (one read).  Multipart uploads
    complete on close, so the object never appears partially under its name; a source that moves
    while read raises SourceChanged, an interrupt Cancelled."""
    st0 = os.stat(src)
    cd = ChunkDigests()
    with open(src, "rb") as fi, fs.open(target, "wb") as fo:
        while True:
            if CANCEL.is_set():
                raise Cancelled(f"{rel}: upload cancelled")
            b = fi.read(cd.want(8 << 20))
            if not b:
                break
            fo.write(b)
            cd.update(b)
            if progress:
                progress(len(b))
    st1 = os.stat(src)
    if cd.total != st0.st_size or (st1.st_size, st1.st_mtime_ns) != (st0.st_size, st0.st_mtime_ns):
        raise SourceChanged(f"{src}: changed while being uploaded; is the checkpoint still being written?")
    return Copied(rel, cd.total, cd.finish())


def fsync_tree_dirs(root: str, dirs: list[str]) -> None:
    from ..io.atomic import fsync_dir
    for d in sorted(dirs, key=lambda p: -p.count("/")):
        fsync_dir(os.path.join(root, d))
    fsync_dir(root)
