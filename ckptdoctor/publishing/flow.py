"""publish: a checkpoint appears at DEST_ROOT/<name> whole or not at all, then the tracker moves.

One protocol, `publish()`: stage, fill, seal, commit, after-commit, over two strategies:
  rename-commit (`LocalCommit`, one POSIX filesystem): copy+hash into
    DEST_ROOT/.<name>.ckptdoctor-tmp-<host>-<pid>-<nonce>, fsync files, manifest, fsync dirs,
    renameat2(NOREPLACE) to <name> (RENAME_EXCHANGE for --replace), fsync DEST_ROOT.
  marker-commit (`ObjectCommit`, object stores, no rename): <name>/.ckptdoctor-publishing, upload
    data objects then the framework's markers, confirm every size with one listing per directory,
    create the manifest exclusively (the commit), remove the in-progress object.
Then, for both: the tracker (temp, fsync, rename, fsync locally; one PUT remotely), then retention.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from ..values import value, field

from .. import __version__
from ..engine.errors import CkptDoctorError, InputError, TransientError, UsageError
from ..io import hashing
from ..io.atomic import fsync_dir, rename_exchange, rename_noreplace, write_new
from ..io.fs import LocalStorage, is_transient, is_url, read_regular, walk_files
from ..layouts import manifest as mf
from . import faults, naming
from .dest import LocalDest, ObjectDest, after_commit
from .copier import SourceChanged, copy_tree, fsync_tree_dirs, list_tree, snapshot, snapshot_diff, source_tree


class PublishRefused(CkptDoctorError):
    exit_code = 1


@value(kw_only=True)
class AfterCommitResult:
    """What the after-commit step (tracker, retention) and leftover cleaning record; shared by a
    single-node publish and a part publish."""
    tracker: dict | None = None        # {file, old, new, written, note}
    pruned: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    cleaned: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = dict(self.__dict__)  # the subclass's own fields first, as the report has always shown them
        return {k: d[k] for k in sorted(d, key=lambda k: k in AfterCommitResult.__value_fields__)}


@value
class PublishResult(AfterCommitResult):
    source: str
    dest: str
    name: str
    status: str = "published"          # published | unchanged | replaced
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0


def _manifest(copied: dict, layout: str | None, chunk: int, extra: dict | None = None) -> bytes:
    """The published manifest from the digests the copy computed (`copied`: rel -> size, digests)."""
    return mf.build({r: c.size for r, c in copied.items()},
                    {(r, i): d for r, c in copied.items() for i, d in enumerate(c.digests)},
                    chunk_bytes=chunk, layout=layout, tool=f"ckptdoctor {__version__}", nodes=mf.writer_nodes(),
                    extra=extra)


def _same_content(src: str, files: dict[str, int], manifest_bytes: bytes, workers, progress) -> bool:
    """Does a published manifest describe exactly SRC's bytes?  Hashes SRC (one read)."""
    try:
        want = mf.parse(manifest_bytes, mf.NAME)
    except mf.ManifestError:
        return False
    if set(want) != set(files) or any(want[r].size != files[r] for r in files):
        return False
    return _storage_matches(LocalStorage(src), manifest_bytes, workers, progress)


def _storage_matches(st, manifest_bytes: bytes, workers, progress) -> bool:
    """Do the bytes under `st` hash to exactly what the manifest lists (every file, every chunk)?"""
    try:
        want = mf.parse(manifest_bytes, mf.NAME)
        listed = walk_files(st)
    except (mf.ManifestError, OSError):
        return False
    listed.pop(mf.NAME, None)
    listed.pop(naming.in_progress_object(), None)  # ours, on an object store whose commit finished
    if set(listed) != set(want) or any(want[r].size != listed[r] for r in want):
        return False
    chunk = next(iter(want.values())).chunk_bytes if want else hashing.CHUNK_BYTES
    units = [u for r, e in want.items() for u in hashing.units_for(r, e.size, chunk=chunk)]
    bad: dict = {}
    got = hashing.hash_units(st, units, workers, progress, on_error=bad.__setitem__)
    return not bad and all(u in got and want[u.rel].digests[u.index] == got[u][0] and got[u][1] == u.length
                           for u in units)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _clean_own_leftovers(root: str, name: str, result: PublishResult) -> None:
    """Remove what earlier, dead publishes of `name` (or tracker writes) left here; only ours."""
    trackers = naming.tracker_files()
    for e in sorted(os.listdir(root)):
        own = naming.parse_own(e)
        if not own:
            continue
        if own["kind"] == "trash":  # already renamed away from its live name: always safe to delete
            _remove(os.path.join(root, e))
            result.cleaned.append(e)
            continue
        if own["name"] not in trackers | {name}:
            continue  # another checkpoint's publish: not ours to judge
        if own["host"] != naming.HOST:
            result.notes.append(f"left alone: {e} (a publish of {own['name']} from host {own['host']}; "
                                f"remove it once that publish is known dead)")
            continue
        if naming.owner_alive(own):
            if own["name"] in trackers:
                continue  # a live publish writing the tracker under the lock: not ours, not a conflict
            if int(own["pid"]) != os.getpid():
                raise UsageError(f"another publish of {name} is in progress here (pid {own['pid']}, {e}); "
                                 f"wait for it or kill it first")
        _remove(os.path.join(root, e))
        result.cleaned.append(e)
    if result.cleaned:
        fsync_dir(root)


def publish(dest, src: str, name: str, layout: str | None, markers: set[str], *, replace: bool, tracker: str,
            keep_last, keep_every, workers, progress_factory, trust_manifest: bool = False,
            listing=None) -> PublishResult:
    """The one commit protocol: stage, fill, seal, commit, after-commit -- over a rename-commit
    (`LocalCommit`) or marker-commit (`ObjectCommit`) destination."""
    try:
        return _publish(dest, src, name, layout, markers, replace=replace, tracker=tracker, keep_last=keep_last,
                        keep_every=keep_every, workers=workers, progress_factory=progress_factory,
                        trust_manifest=trust_manifest, listing=listing)
    except CkptDoctorError:
        raise
    except Exception as exc:
        dest.translate(exc)  # a storage error as the exit-code contract says, or unchanged
        raise


def _after_commit(dest, name, res, tracker, keep_last, keep_every) -> None:
    """After the commit, under the destination's lock; a failure here must say the checkpoint landed."""
    try:
        with dest.lock():
            after_commit(dest, name, res, tracker, keep_last, keep_every)
    except (CkptDoctorError, OSError) as exc:
        msg = str(exc) if isinstance(exc, CkptDoctorError) else (exc.strerror or str(exc))
        raise InputError(f"{dest.show(name)} is published and complete, but the step after the commit failed: "
                         f"{msg}; the tracker was not moved past it (re-run publish to finish)") from None


def _publish(dest, src, name, layout, markers, *, replace, tracker, keep_last, keep_every, workers,
             progress_factory, trust_manifest=False, listing=None) -> PublishResult:
    t0 = time.perf_counter()
    faults.point("start")
    naming.check_name(name)
    res = PublishResult(src, dest.display, name)
    dest.prepare(name, replace, res)
    tree = source_tree(src, listing)   # the verify's listing of the source, when it made one
    before = snapshot(src, tree)
    dirs, files = list_tree(src, tree)
    files.pop(mf.NAME, None)  # the published manifest is computed from the bytes copied
    res.files, res.bytes = len(files), sum(files.values())
    exists = dest.exists(name)
    if exists:
        prog = progress_factory(res.bytes, f"comparing {name}")
        try:
            man = dest.published_manifest(name)
            same = man is not None and _same_content(src, files, man, workers, prog)
        finally:
            prog.close()
        if same and not trust_manifest:  # the destination's bytes, not only its manifest, must match
            prog = progress_factory(res.bytes, f"re-reading {name} at the destination")
            try:
                same = dest.matches_manifest(name, man, workers, prog)
            finally:
                prog.close()
        if same:
            res.status = "unchanged"
            res.notes.append(f"{dest.show(name)} already holds exactly these bytes ("
                             + ("manifest trusted" if trust_manifest else "destination re-read") + "); nothing copied")
            dest.finish_unchanged(name)
            _after_commit(dest, name, res, tracker, keep_last, keep_every)
            res.seconds = time.perf_counter() - t0
            return res
        if not replace:
            raise UsageError(f"{dest.show(name)} exists with content different from {src}; refusing to overwrite a "
                             f"published checkpoint (use --replace to swap it atomically, or --name to publish "
                             f"under another name)")
    stage = dest.stage(name)
    try:
        prog = progress_factory(res.bytes, f"publishing {name}")
        try:
            copied = dest.fill(stage, src, dirs, files, markers, workers, prog)
        finally:
            prog.close()
        src_man = os.path.join(src, mf.NAME)
        plan = None
        if os.path.exists(src_man):  # the source's own manifest must agree with what was read
            plan = _check_source_manifest(src_man, copied)
        changed = snapshot_diff(before, snapshot(src))  # nothing added, removed or rewritten meanwhile
        if changed:
            raise SourceChanged(f"source changed while publishing: {changed}")
        dest.seal(stage, dirs, files, _manifest(copied, layout, hashing.CHUNK_BYTES,
                                                extra={"read_plan": plan} if plan is not None else None))
        res.status = dest.commit(stage, name, exists)
    except BaseException as exc:
        dest.abort(stage, exc)
        raise
    _after_commit(dest, name, res, tracker, keep_last, keep_every)
    faults.point("done")
    res.seconds = time.perf_counter() - t0
    return res


class LocalCommit(LocalDest):
    """rename-commit: stage in a temp directory beside the final name, fill it by copying and
    hashing, seal (fsync files, manifest, fsync dirs), commit with renameat2(RENAME_NOREPLACE)
    (or RENAME_EXCHANGE for --replace), fsync DEST_ROOT."""

    def show(self, name: str) -> str:
        return os.path.join(self.root, name)

    def prepare(self, name: str, replace: bool, res: PublishResult) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except PermissionError:
            raise InputError(f"{self.root}: destination not writable (permission denied)") from None
        except OSError as exc:
            raise InputError(f"{self.root}: cannot create destination: {exc.strerror or exc}") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise InputError(f"{self.root}: destination not writable")
        _clean_own_leftovers(self.root, name, res)

    def exists(self, name: str) -> bool:
        return os.path.lexists(self.show(name))

    def published_manifest(self, name: str) -> bytes | None:
        try:
            return read_regular(os.path.join(self.show(name), mf.NAME), mf.MAX_MANIFEST_BYTES)
        except (OSError, ValueError):
            return None

    def finish_unchanged(self, name: str) -> None:
        pass

    def stage(self, name: str) -> str:
        tmp = os.path.join(self.root, naming.temp_name(name))
        try:
            os.mkdir(tmp, 0o755)
        except PermissionError:
            raise InputError(f"{self.root}: destination not writable (permission denied)") from None
        return tmp

    def fill(self, tmp, src, dirs, files, markers, workers, progress) -> dict:
        return copy_tree(src, tmp, dirs, files, workers, progress)

    def seal(self, tmp, dirs, files, manifest: bytes) -> None:
        write_new(os.path.join(tmp, mf.NAME), manifest)
        faults.point("manifest")
        fsync_tree_dirs(tmp, dirs)

    def commit(self, tmp: str, name: str, exists: bool) -> str:
        final = self.show(name)
        if exists:
            _swap(tmp, final, self.root, name)
            return "replaced"
        try:
            rename_noreplace(tmp, final)
        except FileExistsError:
            raise UsageError(f"{final}: appeared while publishing (another publisher?); "
                             f"nothing replaced") from None
        try:
            fsync_dir(self.root)
        except OSError as exc:  # the rename happened: say so, never "temporary copy removed"
            raise InputError(f"{final} was renamed into place, but the directory fsync of {self.root} failed "
                             f"({exc.strerror or exc}): the checkpoint may not survive a power loss; the "
                             f"tracker was not moved (re-run publish to finish)") from None
        faults.point("rename")
        return "published"

    def matches_manifest(self, name: str, manifest: bytes, workers, progress) -> bool:
        return _storage_matches(LocalStorage(self.show(name)), manifest, workers, progress)

    def abort(self, tmp: str, exc: BaseException) -> None:
        if isinstance(exc, CkptDoctorError) and not os.path.exists(tmp):
            return  # committed (the temp is gone): the message already says what happened
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, SourceChanged):
            raise InputError(f"publish aborted: {exc}; nothing published, tracker untouched") from None
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InputError(f"{self.root}: no space left (or quota exceeded) while publishing; "
                             f"temporary copy removed, tracker untouched") from None
        if isinstance(exc, PermissionError):
            raise InputError(f"{exc.filename or self.root}: permission denied while publishing; "
                             f"temporary copy removed, tracker untouched") from None

    def translate(self, exc: Exception) -> None:
        pass  # commands/publish.py reports a local OSError as one line


def _check_source_manifest(path: str, copied: dict) -> dict | None:
    """Refuse a source whose bytes differ from its own manifest; return the manifest's read plan."""
    try:
        raw = read_regular(path, mf.MAX_MANIFEST_BYTES)
        want = mf.parse(raw, mf.NAME)
    except (mf.ManifestError, ValueError, OSError):
        return None  # verify reports a corrupt manifest (CKD154); publish writes a fresh one
    chunk_ok = all(e.chunk_bytes == hashing.CHUNK_BYTES for e in want.values())
    for rel, e in want.items():
        c = copied.get(rel)
        if c is None or c.size != e.size or (chunk_ok and c.digests != e.digests):
            raise SourceChanged(f"{rel}: the source's bytes differ from its own {mf.NAME} "
                                f"(corrupted or rewritten since the manifest)")
    return mf.read_plan_of(raw)


def _swap(tmp: str, final: str, root: str, name: str) -> None:
    """--replace: exchange atomically where the kernel can; the old tree then sits at tmp."""
    if rename_exchange(tmp, final):
        fsync_dir(root)
        faults.point("swap")
        trash = os.path.join(root, naming.trash_name(name))
        os.rename(tmp, trash)
        fsync_dir(root)
        shutil.rmtree(trash, ignore_errors=True)
        return
    # no renameat2: move the old one to trash, then the new one in (a short window with neither)
    trash = os.path.join(root, naming.trash_name(name))
    os.rename(final, trash)
    faults.point("swap")
    os.rename(tmp, final)
    fsync_dir(root)
    shutil.rmtree(trash, ignore_errors=True)


class ObjectCommit(ObjectDest):
    """marker-commit (no rename on object stores): stage with `<name>/.ckptdoctor-publishing`,
    fill by uploading data objects then the framework's markers, seal by confirming every size with
    one fresh listing per directory, commit by creating the manifest exclusively, then remove the
    in-progress object."""

    def show(self, name: str) -> str:
        return f"{self.display.rstrip('/')}/{name}"

    def prepare(self, name: str, replace: bool, res: PublishResult) -> None:
        if replace:
            raise UsageError("--replace is refused on object stores: without an atomic rename a replaced "
                             "checkpoint would be a mix of two generations; publish under a new name")

    def exists(self, name: str) -> bool:
        return self.fs.exists(f"{self.root}/{name}/{mf.NAME}")

    def published_manifest(self, name: str) -> bytes | None:
        return self.fs.cat_file(f"{self.root}/{name}/{mf.NAME}")

    def matches_manifest(self, name: str, manifest: bytes, workers, progress) -> bool:
        from ..io.fs import FsspecStorage
        return _storage_matches(FsspecStorage(self.show(name), fs=self.fs), manifest, workers, progress)

    def finish_unchanged(self, name: str) -> None:
        inprog = f"{self.root}/{name}/{naming.in_progress_object()}"
        if self.fs.exists(inprog):
            self.fs.rm_file(inprog)

    def stage(self, name: str) -> str:
        final = f"{self.root}/{name}"
        self.fs.pipe_file(f"{final}/{naming.in_progress_object()}",
                          json.dumps({"host": naming.HOST, "pid": os.getpid(), "started": mf.utc_now()}).encode())
        return final

    def fill(self, final, src, dirs, files, markers, workers, progress) -> dict:
        data = sorted((r for r in files if r not in markers), key=lambda r: -files[r])
        last = sorted(r for r in files if r in markers)
        copied = _upload(self.fs, src, final, data, workers, progress)
        faults.point("upload")
        copied.update(_upload(self.fs, src, final, last, workers, progress))  # framework markers after data
        return copied

    def seal(self, final, dirs, files, manifest: bytes) -> None:
        listed = {}
        for d in {"", *dirs}:
            base = f"{final}/{d}" if d else final
            for it in _ls_fresh(self.fs, base):
                if it.get("type") != "directory":
                    listed[it["name"][len(final) + 1:]] = it.get("size")
        bad = [r for r in files if listed.get(r) != files[r]]
        if bad:
            raise InputError(f"{self.display}: uploaded object size mismatch for {bad[0]} "
                             f"({listed.get(bad[0])} != {files[bad[0]]}); not committed")
        self._manifest = manifest

    def commit(self, final: str, name: str, exists: bool) -> str:
        try:
            self.fs.pipe_file(f"{final}/{mf.NAME}", self._manifest, mode="create")
        except TypeError:  # filesystems without exclusive create
            if self.fs.exists(f"{final}/{mf.NAME}"):
                raise UsageError(f"{final}: another publisher committed first; nothing overwritten") from None
            self.fs.pipe_file(f"{final}/{mf.NAME}", self._manifest)
        except FileExistsError:
            raise UsageError(f"{final}: another publisher committed first; nothing overwritten") from None
        faults.point("manifest")
        self.fs.rm_file(f"{final}/{naming.in_progress_object()}")
        return "published"

    def abort(self, final: str, exc: BaseException) -> None:
        pass  # nothing to roll back: without the manifest the upload is uncommitted (CKD201); a re-run finishes it

    def translate(self, exc: Exception) -> None:
        if is_transient(exc):
            raise TransientError(f"{self.display}: storage unreachable while publishing: {exc}; not committed "
                                 f"(re-run to finish)") from None
        if isinstance(exc, OSError):
            raise InputError(f"{self.display}: {exc}; not committed (re-run to finish)") from None


def _ls_fresh(fs, path: str) -> list[dict]:
    """One listing of `path`, bypassing fsspec's listing cache where the filesystem has one."""
    try:
        return fs.ls(path, detail=True, refresh=True)
    except TypeError:
        return fs.ls(path, detail=True)


def _upload(fs, src: str, final: str, rels: list[str], workers, progress) -> dict:
    """Stream each file to its final object name while hashing it (one read).  Multipart uploads
    complete on close, so an object never appears partially under its name."""
    from concurrent.futures import ThreadPoolExecutor
    from .copier import Copied, copy_workers, gather, upload_file

    def one(rel: str) -> Copied:
        try:
            return upload_file(fs, os.path.join(src, rel), f"{final}/{rel}", rel, progress)
        except SourceChanged as exc:
            raise InputError(f"publish aborted: {exc}; not committed") from None

    workers = copy_workers(workers, len(rels))
    if len(rels) <= 1:
        return {r: one(r) for r in rels}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckd-upload") as ex:
        return gather({r: ex.submit(one, r) for r in rels})  # an interrupt stops the uploads at once


def is_inside(dest_root: str, src: str) -> bool:
    """Is DEST_ROOT (or the checkpoint it would receive) the source or inside it?"""
    if is_url(dest_root) and not dest_root.startswith("file://"):
        return False
    root = os.path.realpath(dest_root[len("file://"):] if dest_root.startswith("file://") else dest_root)
    src = os.path.realpath(src)
    return root == src or root.startswith(src.rstrip("/") + "/")


def destination(dest_root: str):
    """The commit strategy for DEST_ROOT: marker-commit on object stores, rename-commit elsewhere."""
    if is_url(dest_root) and not dest_root.startswith("file://"):
        import fsspec
        try:
            fs, root = fsspec.core.url_to_fs(dest_root)
        except ImportError as exc:
            from ..io.fs import install_hint
            raise InputError(f"{dest_root}: no filesystem driver for this URL ({exc.name or exc}); "
                             f"{install_hint(dest_root)}") from None
        except ValueError as exc:
            raise InputError(f"{dest_root}: {exc}") from None
        return ObjectCommit(fs, root.rstrip("/"), dest_root)
    root = dest_root[len("file://"):] if dest_root.startswith("file://") else dest_root
    return LocalCommit(os.path.abspath(root))
