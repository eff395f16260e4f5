"""Run a command in this process with a fixed delay charged for every filesystem metadata call.

    python benchmarks/latency/delayed.py --delay-ms 2 --stats out.json -- verify --target resume ROOT
    python benchmarks/latency/delayed.py --delay-ms 2 --stats out.json --plain-find --threads 32 -- ROOT

The layer wraps the calls a metadata server answers (os.stat, os.lstat, os.scandir and each
DirEntry.stat it yields, os.listdir, os.open, os.access, os.readlink, os.unlink, os.rmdir,
os.rename) so that each sleeps
`--delay-ms` before doing the real call (with `--only-under DIR`, only calls on paths under DIR: the
storage measured, not the tool's own install, whose ~100 rule-file stats in a source checkout
were charged as if they were the checkpoint's until session 22; they are counted as "uncharged").
`--read-delay-ms` also charges each os.read, os.pread and os.preadv (a cold read on a parallel
filesystem is a round trip to a data server); off unless given.  time.sleep releases the GIL, so
calls made from several threads are answered concurrently, as a parallel filesystem's metadata servers answer concurrent
requests.  It is the same code path ckptdoctor takes on a local disk; only the cost per call is
changed.  `--stats` receives operations by kind, operations per file of the tree, the largest
number in flight at once, and the wall time.

Why not only the FUSE layer (delayfs.py): on this machine's kernel (6.18) with libfuse 3.14 through
mfusepy, LOOKUPs of names in one directory reach the daemon one at a time even with
FUSE_CAP_PARALLEL_DIROPS requested (measured: 32 threads statting 200 files of one directory, at
most 1 request in flight, 2.8 ms per file; files of 4 directories: 4 in flight).  A metadata server
behind NFS or Lustre answers concurrent lookups in one directory, so that layer would measure the
FUSE client, not the tool.  delayfs.py stays for counting what real syscalls reach the filesystem.

`--plain-cp` copies SRC to DST the plain way (see plain_cp), for `latency_bench.py publish`.

`--plain-find` runs the plain tool instead of ckptdoctor: `find ROOT -printf '%s\n'` done in
Python (scandir, then one stat per entry), serially or with `--threads` workers, through the same
layer.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

_real = {n: getattr(os, n) for n in ("stat", "lstat", "scandir", "listdir", "open", "access", "readlink", "unlink",
                                     "rmdir", "rename", "read", "pread", "preadv")}
_lock = threading.Lock()
state = {"ops": {}, "in_flight": 0, "max_in_flight": 0, "delay": 0.0, "under": (), "uncharged": 0,
         "read_delay": 0.0}


def _measured(path) -> bool:
    """Whether a call on `path` reaches the storage measured (a descriptor: it does)."""
    if not state["under"]:
        return True
    if isinstance(path, int):   # a descriptor: measured when it names a file under the roots
        try:
            path = _real["readlink"](f"/proc/self/fd/{path}")
        except OSError:
            return True
    p = os.fsdecode(os.fspath(path))
    if not p.startswith("/"):
        p = os.path.join(os.getcwd(), p)
    return p.startswith(state["under"])


def _charge(kind: str, path=None) -> None:
    if path is not None and not _measured(path):
        with _lock:
            state["uncharged"] += 1
        return
    with _lock:
        state["ops"][kind] = state["ops"].get(kind, 0) + 1
        state["in_flight"] += 1
        state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
    try:
        delay = state["read_delay"] if kind == "read" else state["delay"]
        if delay:
            time.sleep(delay)
    finally:
        with _lock:
            state["in_flight"] -= 1


class _Entry:
    """A DirEntry whose stat() is a round trip (the name and type came with the listing)."""
    __slots__ = ("_de",)

    def __init__(self, de):
        self._de = de

    def __getattr__(self, name):
        return getattr(self._de, name)

    def __fspath__(self):
        return self._de.path

    def stat(self, *, follow_symlinks=True):
        _charge("stat", self._de.path)
        return self._de.stat(follow_symlinks=follow_symlinks)


class _Scandir:
    def __init__(self, it):
        self._it = it

    def __iter__(self):
        return (_Entry(de) for de in self._it)

    def __next__(self):
        return _Entry(next(self._it))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._it.close()

    def close(self):
        self._it.close()


def install(delay_s: float, under: tuple[str, ...] = (), read_delay_s: float = 0.0) -> None:
    state["delay"] = delay_s
    state["read_delay"] = read_delay_s
    state["under"] = tuple(os.path.join(os.path.realpath(u), "") for u in under)

    def wrap(kind, fn):
        def call(*a, **k):
            _charge(kind, a[0] if a else None)
            return fn(*a, **k)
        call.__wrapped__ = fn
        return call
    os.stat = wrap("stat", _real["stat"])
    os.lstat = wrap("stat", _real["lstat"])
    os.listdir = wrap("listdir", _real["listdir"])
    os.open = wrap("open", _real["open"])
    os.access = wrap("access", _real["access"])
    os.readlink = wrap("readlink", _real["readlink"])
    os.unlink = wrap("unlink", _real["unlink"])
    os.rmdir = wrap("rmdir", _real["rmdir"])
    os.rename = wrap("rename", _real["rename"])
    if read_delay_s:   # reads of file data: a round trip to a data server (an OST) for a cold file
        os.read = wrap("read", _real["read"])
        os.pread = wrap("read", _real["pread"])
        os.preadv = wrap("read", _real["preadv"])

    def scandir(*a, **k):
        _charge("listdir", a[0] if a else ".")
        return _Scandir(_real["scandir"](*a, **k))
    os.scandir = scandir


def plain_find(root: str, threads: int) -> int:
    """find ROOT -printf '%s\\n': list each directory, stat each entry (with `threads` workers)."""
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    total, dirs = 0, [root]
    while dirs:
        listed = list(pool.map(lambda d: [e.path for e in os.scandir(d)], dirs)) if pool else \
            [[e.path for e in os.scandir(d)] for d in dirs]
        paths = [p for names in listed for p in names]
        sts = list(pool.map(os.lstat, paths)) if pool else [os.lstat(p) for p in paths]
        dirs = [p for p, st in zip(paths, sts) if (st.st_mode & 0o170000) == 0o040000]
        for st in sts:
            sys.stdout.write(f"{st.st_size}\n")
            total += 1
    return total


def plain_cp(src: str, dst: str, threads: int) -> int:
    """`cp -r SRC DST` plus an fsync of each file (what a durable copy needs), done in Python through
    the same layer: a walk, then per file an open of each side, the bytes, fsync; serially or on
    `threads` workers (the way parallel copy tools such as mpifileutils' dcp or `parallel cp` run)."""
    from concurrent.futures import ThreadPoolExecutor
    rels, stack = [], [""]
    while stack:
        sub = stack.pop()
        os.makedirs(os.path.join(dst, sub), exist_ok=True)
        for e in os.scandir(os.path.join(src, sub)):
            r = f"{sub}/{e.name}" if sub else e.name
            (stack if e.is_dir(follow_symlinks=False) else rels).append(r)

    def one(r: str) -> None:
        fi = os.open(os.path.join(src, r), os.O_RDONLY)
        fo = os.open(os.path.join(dst, r), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            while True:
                b = os.read(fi, 1 << 20)
                if not b:
                    break
                os.write(fo, b)
            os.fsync(fo)
        finally:
            os.close(fi)
            os.close(fo)
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, rels))
    else:
        for r in rels:
            one(r)
    return len(rels)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--stats")
    ap.add_argument("--plain-find", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plain-rm", action="store_true", help="rm -rf ARGS (shutil.rmtree: one unlink after another)")
    ap.add_argument("--plain-cp", action="store_true", help="cp -r SRC DST with an fsync per file (--threads workers)")
    ap.add_argument("--files", type=int, default=0, help="files in the tree, for operations per file")
    ap.add_argument("--read-delay-ms", type=float, default=0.0,
                    help="also delay each os.read/pread/preadv this long (data round trips; default: not charged)")
    ap.add_argument("--only-under", action="append", default=[], help="charge only calls on paths under this "
                                                                       "directory (repeatable; default: every call)")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    install(a.delay_ms / 1000, tuple(a.only_under), a.read_delay_ms / 1000)
    t = time.perf_counter()
    rc = 0
    try:
        if a.plain_find:
            plain_find(a.args[0], a.threads)
        elif a.plain_cp:
            plain_cp(a.args[0], a.args[1], a.threads)
        elif a.plain_rm:
            import shutil
            for p in a.args:
                shutil.rmtree(p)
        else:
            sys.argv = ["ckptdoctor", *a.args]
            from ckptdoctor.__main__ import run
            try:
                run()
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        wall = time.perf_counter() - t
        if a.stats:
            ops = dict(state["ops"])
            out = {"wall_s": round(wall, 3), "ops": ops, "max_in_flight": state["max_in_flight"],
                   "delay_ms": a.delay_ms, "rc": rc, "uncharged": state["uncharged"]}
            if a.files:
                out["ops_per_file"] = {k: round(v / a.files, 3) for k, v in ops.items()}
            with open(a.stats, "w") as fh:
                json.dump(out, fh)
    return rc


if __name__ == "__main__":
    sys.exit(main())
