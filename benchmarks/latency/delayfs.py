"""A read-only FUSE passthrough that charges a fixed delay for every metadata operation.

    python benchmarks/latency/delayfs.py SOURCE MOUNTPOINT --delay-ms 2 --stats stats.json

It models a parallel filesystem (Lustre, GPFS, NFS) whose metadata server answers each request
after `--delay-ms`: LOOKUP and GETATTR (both arrive as `getattr`), READDIR, OPEN/OPENDIR,
READLINK, ACCESS, STATFS each sleep that long before answering; reads of file data do not sleep
(their cost is bandwidth, measured elsewhere).  Requests are served by up to `--threads` threads at
once, so a client that issues operations concurrently gets them answered concurrently, as a real
metadata server would.

On unmount (`fusermount3 -u MOUNTPOINT`) it writes `--stats`: operations by kind and the largest
number in flight at once.  The kernel caches a looked-up entry and its attributes for 1 s
(libfuse's default), as NFS does; each measured command gets a fresh mount so that it starts cold.
Uses mfusepy (pip install mfusepy) and libfuse 3 (apt-get install fuse3).
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import threading
import time

import mfusepy as fuse


FUSE_CAP_PARALLEL_DIROPS = 1 << 18   # libfuse 3 fuse_common.h


class DelayFS(fuse.Operations):
    use_ns = True

    def __init__(self, source: str, delay: float, stats: str | None):
        self.source, self.delay, self.stats_path = os.path.realpath(source), delay, stats
        self.counts: dict[str, int] = {}
        self.in_flight = self.max_in_flight = 0
        self._mu = threading.Lock()

    def _p(self, path: str) -> str:
        return self.source + path

    def _charge(self, kind: str, delay: bool = True) -> None:
        with self._mu:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if delay and self.delay:
                time.sleep(self.delay)
        finally:
            with self._mu:
                self.in_flight -= 1

    def _os(self, fn, *args):
        try:
            return fn(*args)
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno or errno.EIO) from None

    def init_with_config(self, conn_info, config_3):
        # Lookups in one directory answered concurrently, as NFS and Lustre clients issue them
        # (without this flag the kernel serialises them per directory: measured max in flight 1)
        if conn_info is not None and conn_info.capable & FUSE_CAP_PARALLEL_DIROPS:
            conn_info.want |= FUSE_CAP_PARALLEL_DIROPS
        self.parallel_dirops = bool(conn_info is not None and conn_info.want & FUSE_CAP_PARALLEL_DIROPS)

    def getattr(self, path, fh=None):
        self._charge("stat")
        st = self._os(os.lstat, self._p(path))
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid",
                                            "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_ino")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def readdir(self, path, fh):
        self._charge("listdir")
        return [".", "..", *self._os(os.listdir, self._p(path))]

    def opendir(self, path):
        self._charge("opendir")
        return 0

    def readlink(self, path):
        self._charge("readlink")
        return self._os(os.readlink, self._p(path))

    def access(self, path, amode):
        self._charge("access")
        if not os.access(self._p(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def statfs(self, path):
        self._charge("statfs")
        sv = os.statvfs(self._p(path))
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                            "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def open(self, path, flags):
        self._charge("open")
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        return self._os(os.open, self._p(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        self._charge("read", delay=False)
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        self._charge("close", delay=False)
        os.close(fh)
        return 0

    def destroy(self, path):
        if self.stats_path:
            with open(self.stats_path, "w") as fh:
                json.dump({"ops": self.counts, "max_in_flight": self.max_in_flight,
                           "delay_ms": self.delay * 1000,
                           "parallel_dirops": getattr(self, "parallel_dirops", None)}, fh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=256, help="FUSE worker threads (requests answered at once)")
    ap.add_argument("--stats")
    a = ap.parse_args()
    fuse.FUSE(DelayFS(a.source, a.delay_ms / 1000, a.stats), a.mountpoint, foreground=True, ro=True,
              max_threads=a.threads, max_idle_threads=a.threads, fsname="delayfs", debug=bool(os.environ.get("DELAYFS_DEBUG")))


if __name__ == "__main__":
    main()
