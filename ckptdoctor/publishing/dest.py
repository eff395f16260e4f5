"""A publish destination's writable interface, and the after-commit step every commit strategy shares.

`LocalDest` (a POSIX directory) and `ObjectDest` (an fsspec object store) list, read and write
the destination root; the commit strategies in flow.py (`LocalCommit`: rename-commit,
`ObjectCommit`: marker-commit) build on them.  After-commit lives here once: the tracker (never
backwards, written last and atomically), then retention, which never prunes the tracker's target,
the checkpoint just published, or one still being written -- whatever `--tracker` says.
"""
from __future__ import annotations

import contextlib
import os
from typing import Protocol

from ..engine.errors import UsageError
from ..io.atomic import replace_file
from ..layouts import manifest as mf
from ..layouts import trackers
from ..layouts.spec import Layout
from . import faults, naming, retention

MAX_TRACKER_READ = trackers.MAX_TRACKER_BYTES


class Dest(Protocol):
    display: str

    def entries(self) -> list[str]: ...
    def read_file(self, name: str) -> bytes | None: ...
    def write_tracker(self, name: str, data: bytes) -> None: ...
    def prune(self, victims: list[str]) -> None: ...


class LocalDest:
    def __init__(self, root: str):
        self.root = self.display = root

    @contextlib.contextmanager
    def lock(self, timeout: float = 600.0):
        """Serialize tracker updates and retention per DEST_ROOT: flock on DEST_ROOT/.ckptdoctor-lock
        (released by the kernel even on SIGKILL).  Listing, tracker read, tracker write and retention
        happen under it, so two publishes cannot move the tracker backwards or prune what the
        other's tracker names."""
        import fcntl
        import time
        path = os.path.join(self.root, naming.LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        faults.point("lock-wait")   # the race tests hold the lock and wait for this, then change the root
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise UsageError(f"{path}: another publish holds the destination lock for more than "
                                         f"{timeout:.0f} s; is one stuck?") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    def entries(self) -> list[str]:
        return sorted(os.listdir(self.root))

    def read_file(self, name: str) -> bytes | None:
        import stat
        p = os.path.join(self.root, name)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"{p}: cannot read the destination's tracker: {exc.strerror or exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UsageError(f"{p}: the destination's tracker is not a regular file; fix it by hand")
            return os.read(fd, MAX_TRACKER_READ)
        finally:
            os.close(fd)

    def write_tracker(self, name: str, data: bytes) -> None:
        replace_file(os.path.join(self.root, name), data, temp_name=naming.temp_name(name),
                     before_rename=lambda: faults.point("tracker-temp"))

    def prune(self, victims: list[str]) -> None:
        retention.prune(self.root, victims)

    def real_dir(self, name: str) -> bool:
        import stat
        try:
            return stat.S_ISDIR(os.lstat(os.path.join(self.root, name)).st_mode)
        except OSError:
            return False


class ObjectDest:
    def __init__(self, fs, root: str, display: str):
        self.fs, self.root, self.display = fs, root, display

    @contextlib.contextmanager
    def lock(self):
        # Object stores offer no lock through fsspec; the tracker is one PUT and retention re-reads
        # it, but two concurrent publishes into one prefix can still race (documented).
        yield

    def entries(self) -> list[str]:
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))
        except FileNotFoundError:
            return []

    def read_file(self, name: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self.root}/{name}", start=0, end=MAX_TRACKER_READ)
        except FileNotFoundError:
            return None

    def write_tracker(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.root}/{name}", data)  # a single PUT: readers see old or new

    def real_dir(self, name: str) -> bool:
        return True   # a prefix: object stores have no links or special files

    def prune(self, victims: list[str]) -> None:
        for victim in victims:  # un-commit first (in-progress object, then manifest), then delete
            base = f"{self.root}/{victim}"
            self.fs.pipe_file(f"{base}/{naming.in_progress_object()}", b'{"deleting": true}')
            if self.fs.exists(f"{base}/{mf.NAME}"):
                self.fs.rm_file(f"{base}/{mf.NAME}")
            faults.point("prune")
            self.fs.rm(base, recursive=True)


MOVED: list[str] = []   # trackers this process has moved (publish's interrupt message reads it)


def after_commit(dest: Dest, name: str, res, tracker_option: str, keep_last: int | None,
                 keep_every: int | None) -> None:
    """Tracker (never backwards), then retention.  `res` is the PublishResult to fill in."""
    entries = dest.entries()
    layout = naming.choose_layout(tracker_option, name, set(entries))
    if layout is not None and layout.tracker and layout.tracker.content:
        _move_tracker(dest, layout, name, entries, res)
    elif tracker_option != "none":
        res.notes.append("no tracker written" + (f" ({layout.family} resumes from the newest directory)"
                                                 if layout else " (no known naming for this checkpoint)"))
    if keep_last is None and not keep_every:
        return
    layout = layout or naming.choose_layout("auto", name, set(entries))
    if layout is None:
        raise UsageError(f"retention needs a known checkpoint naming (iter_NNNNNNN, global_step_N, step-N, "
                         f"step_N, checkpoint-N, <step>); {name!r} is none of them")
    protect = {name: "just published (newest verified)"}
    target = _current_target(dest, layout, entries)
    if target:
        protect.setdefault(target, "the tracker names it")
    plan = retention.plan(entries, layout, keep_last=keep_last, keep_every=keep_every, protect=protect,
                          real_dir=dest.real_dir)
    dest.prune(plan.removed)
    res.pruned, res.kept = plan.removed, plan.kept


def _current_target(dest: Dest, layout: Layout, entries: list[str]) -> str | None:
    """What the destination's tracker names now (read again: it may have just moved)."""
    t = layout.tracker
    if t is None or t.file not in entries:
        return None
    raw = dest.read_file(t.file)
    return naming.tracker_target(layout, raw) if raw is not None else None


def _move_tracker(dest: Dest, layout: Layout, name: str, entries: list[str], res) -> None:
    t = layout.tracker
    new = trackers.render(layout, name)
    raw = dest.read_file(t.file) if t.file in entries else None
    old = raw.decode("utf-8", "replace") if raw is not None else None
    info = res.tracker = {"file": f"{dest.display.rstrip('/')}/{t.file}", "format": layout.family, "old": old,
                          "new": new, "written": False, "note": None}
    old_target = naming.tracker_target(layout, raw) if raw is not None else None
    old_step = layout.steps.step(old_target) if old_target else None
    if old is not None and old.strip() == new:
        info["note"] = "already names this checkpoint"
        return
    if old_step is not None and old_step > (layout.steps.step(name) or 0) and old_target in entries:
        info["note"] = (f"left at {old.strip()!r}: it names a newer checkpoint than {name}; "
                        f"a tracker never moves backwards")
        return
    dest.write_tracker(t.file, new.encode())
    info["written"] = True
    MOVED.append(f"{info['file']} -> {new}")   # what an interrupt after this point must not deny
    faults.point("tracker")

