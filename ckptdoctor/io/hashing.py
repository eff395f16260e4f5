"""Streaming, parallel, bounded-memory hashing of files and file ranges.

xxh3-128 releases the GIL for buffers > 64 KiB, so threads hashing different files or different
ranges of one file scale across cores.  Each worker reads with `readinto` into its own reused
512 KiB buffer, so memory is bounded by workers x 512 KiB no matter how large the files are.
Every read buffer comes from `aligned_buffer`: see there why.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from ..values import value

import xxhash

from .fs import aligned_buffer

# Read size, measured on 2 GiB (8 files, 2 threads, this project's VM, 2026-12-01): cold
# 128 KiB 1.99 GB/s, 512 KiB 2.08, 1 MiB 1.22, 2 MiB 0.97, 8 MiB 1.39 (`cat` 2.22): a read larger
# than the kernel's readahead window waits for the disk instead of finding the pages read ahead.
# Page-cached: 256 KiB 9.5, 512 KiB 10.0, 1 MiB 10.4, 8 MiB 4.8 GB/s (the buffer falls out of cache
# between the copy and the hash).  It stays above xxh3's 64 KiB GIL-release threshold.
BUF_BYTES = 512 << 10
CHUNK_BYTES = 64 << 20  # manifest unit: files larger than this get one digest per 64 MiB range
_local = threading.local()


@value(frozen=True, order=True)
class Unit:
    """One piece of hashing work: `length` bytes of `rel` from `start` (chunk index `index`)."""
    rel: str
    index: int
    start: int
    length: int
    algorithm: str = "xxh3-128"


def units_for(rel: str, size: int, algorithm: str = "xxh3-128", chunk: int = CHUNK_BYTES) -> list[Unit]:
    if algorithm != "xxh3-128" or size <= chunk:
        return [Unit(rel, 0, 0, size, algorithm)]
    return [Unit(rel, i, off, min(chunk, size - off), algorithm) for i, off in enumerate(range(0, size, chunk))]


def _buf() -> memoryview:
    b = getattr(_local, "buf", None)
    if b is None:
        b = _local.buf = aligned_buffer(BUF_BYTES)
    return b


def _hasher(algorithm: str):
    if algorithm == "xxh3-128":
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        import hashlib  # lazy: 4 ms of start-up, and only Megatron integrity.json files ask for it
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def hash_unit(storage, unit: Unit, progress=None) -> tuple[str, int]:
    """(hex digest, bytes actually read); fewer bytes than unit.length means the file shrank."""
    h = _hasher(unit.algorithm)
    buf = _buf()
    done = 0
    with storage.open(unit.rel) as fh:
        if getattr(storage, "local", False):
            try:
                os.posix_fadvise(fh.fileno(), unit.start, unit.length, os.POSIX_FADV_SEQUENTIAL)
            except (AttributeError, OSError):
                pass
        fh.seek(unit.start)
        while done < unit.length:
            want = min(len(buf), unit.length - done)
            n = fh.readinto(buf[:want])
            if not n:
                break
            h.update(buf[:n])
            done += n
            if progress:
                progress(n)
    return h.hexdigest(), done


def hash_units(storage, units: list[Unit], workers: int | None = None, progress=None,
               on_error=None) -> dict[Unit, tuple[str, int]]:
    """Digests of `units`.  With `on_error(unit, exc)`, a unit whose file cannot be read (OSError:
    gone, permission, not a regular file) is reported there and left out; without it, raised."""
    def one(u: Unit):
        try:
            return hash_unit(storage, u, progress)
        except OSError as exc:
            if on_error is None:
                raise
            on_error(u, exc)
            return None

    # One thread per core present: reading page-cached bytes is bound by memory bandwidth, and on
    # 2 cores 4 threads hashed 4 GiB in 0.68-0.85 s where 2 took 0.56-0.74 s.
    # On storage whose calls were measured as round trips (fs.map_io, while listing it), the reads
    # wait on the network, not on a core: as many in flight as the listing had (issue 42).
    from . import fs
    cores = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    workers = workers or (max(cores, fs.io_threads()) if fs._seen_slow else cores)
    if len(units) <= 1 or workers == 1:
        out = {u: one(u) for u in units}
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckd-hash") as ex:
            futs = {u: ex.submit(one, u) for u in units}
            out = {u: f.result() for u, f in futs.items()}
    return {u: r for u, r in out.items() if r is not None}


def partition(units: list[Unit], k: int, n: int) -> list[Unit]:
    """Deterministic slice k of n: largest-first greedy (LPT) by bytes; every unit in exactly one."""
    loads = [0] * n
    mine = []
    for u in sorted(units, key=lambda u: (-u.length, u.rel, u.index)):
        i = min(range(n), key=lambda j: (loads[j], j))
        loads[i] += u.length
        if i == k:
            mine.append(u)
    return mine
