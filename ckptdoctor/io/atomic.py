"""Durable local writes: temp file in the same directory, fsync, link/rename, fsync the directory."""
from __future__ import annotations

import errno
import os
import secrets


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit_via_temp(path: str, data: bytes, temp_name: str, commit) -> None:
    """Write `data` durably to a same-directory temp, `commit(tmp, path)`, fsync the directory;
    the temp is gone afterwards whatever happened."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, temp_name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        commit(tmp, path)
        fsync_dir(d)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def write_new(path: str, data: bytes) -> None:
    """Create `path` with `data` atomically; FileExistsError if it already exists (never replaces)."""
    def link(tmp, dst):
        try:
            os.link(tmp, dst)  # fails with EEXIST instead of replacing
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise FileExistsError(dst) from None
            raise
    _commit_via_temp(path, data, f".{os.path.basename(path)}.tmp.{os.getpid()}.{secrets.token_hex(3)}", link)


def replace_file(path: str, data: bytes, *, temp_name: str | None = None, before_rename=None) -> None:
    """Write `path` atomically, replacing it: same-directory temp, fsync, rename(2), fsync the dir.

    Readers see the old content or the new, never a mix; after return both are durable.
    `before_rename` runs between the durable temp and the rename (crash tests stop there)."""
    def rename(tmp, dst):
        if before_rename:
            before_rename()
        os.replace(tmp, dst)
    _commit_via_temp(path, data, temp_name or
                     f".{os.path.basename(path)}.ckptdoctor-tmp-{os.getpid()}.{secrets.token_hex(3)}", rename)


def replace_symlink(path: str, target: str, *, before_rename=None) -> None:
    """Point the symbolic link `path` at `target` atomically: a same-directory temp link renamed
    over it, then the directory fsynced (a reader follows the old link or the new, never none)."""
    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, f".{os.path.basename(path)}.ckptdoctor-tmp-{os.getpid()}.{secrets.token_hex(3)}")
    os.symlink(target, tmp)
    try:
        if before_rename:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)


# renameat2(2) flags: no Python wrapper exists, so call libc directly where it has one.
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """True when done; False when this platform/filesystem lacks renameat2 (caller falls back)."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP if hasattr(errno, "ENOTSUP") else errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), dst)


def rename_noreplace(src: str, dst: str) -> None:
    """Rename `src` to `dst`, failing with FileExistsError instead of replacing anything."""
    try:
        if _renameat2(src, dst, RENAME_NOREPLACE):
            return
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "exists", dst) from None
        raise
    # fallback: a directory rename onto an existing non-empty directory fails (ENOTEMPTY);
    # check first for files and empty directories (a small race, documented)
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", dst)
    os.rename(src, dst)


def rename_exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (both must exist).  False if the platform cannot."""
    return _renameat2(a, b, RENAME_EXCHANGE)
