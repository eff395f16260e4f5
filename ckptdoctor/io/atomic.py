"""Durable local writes: temp file in the same directory, fsync, link/rename, fsync the directory."""
from __future__ import annotations

import errno
import os


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new(path: str, data: bytes) -> None:
    """Create `path` with `data` atomically; FileExistsError if it already exists (never replaces)."""
    d, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(d, f".{base}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails with EEXIST instead of replacing
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise FileExistsError(path) from None
            raise
        fsync_dir(d)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
