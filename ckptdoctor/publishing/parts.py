"""publish --part K/N --publish-id ID: one checkpoint assembled from N nodes' local disks.

Every node runs one part with the same ID.  The parts share one staging directory beside the final
name, DEST_ROOT/.<name>.ckptdoctor-parts-<ID>/ (rules/publish.yaml `parts_dir`):

    <name>/          the checkpoint being assembled; becomes DEST_ROOT/<name> by one rename
    tmp/             a part's copy in flight (never inside <name>/, so a dead part leaves no half file there)
    journal/K.jsonl  one line per file part K put in place or checked, appended after the rename
    parts/K.json     part K's record (every file it holds, size and xxh3-128 chunk digests), written last
    alive/K          touched every few seconds while part K runs (stale staging is told by it)
    commit           the election: the part that creates it exclusively commits
    failed.json      written by a committer that refused, so the other parts stop waiting

A part copies each of its files to tmp/, fsyncs it, renames it into <name>/ without replacing; a
file that is already there (present on several nodes: `.metadata`, `common.pt`, `config.json`) is
not copied again, but read and compared with this node's copy.  When all N records exist, one part
wins the election and commits: records agree on every shared file, the assembled tree is exactly
the union of the records, structural verify passes, then the merged manifest (with the publish ID),
fsync, rename, fsync, tracker, retention -- the same after-commit as a single-node publish.  A part
that finds DEST_ROOT/<name> committed under its ID exits 0; one re-run with the same ID skips the
files its journal already records (same size and mtime at the source).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import threading
import time
from ..values import value, field

from ..engine.errors import CkptDoctorError, InputError, TransientError, UsageError
from ..io import hashing
from ..io.atomic import fsync_dir, rename_noreplace, replace_file, write_new
from ..io.fs import read_regular
from ..layouts import manifest as mf
from . import faults, naming
from .flow import AfterCommitResult
from .copier import CANCEL, Cancelled, ChunkDigests, Copied, SourceChanged, copy_file, copy_workers, list_tree, \
    snapshot, snapshot_diff, gather, upload_file

RECORD_SCHEMA = "ckptdoctor.part/v1"
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,63}", re.ASCII)
HEARTBEAT_SECONDS = 2.0
POLL_SECONDS = 0.2


class PartRefused(CkptDoctorError):
    """The assembled checkpoint cannot be committed (conflicting copies, missing shards, verify
    errors); nothing was committed and the tracker is untouched."""
    exit_code = 1


class PartTimeout(TransientError):
    """The other parts did not arrive within --timeout; nothing committed (exit 75: re-run)."""


@value(frozen=True)
class PartSpec:
    index: int
    count: int
    publish_id: str

    @classmethod
    def parse(cls, part: str, publish_id: str | None) -> "PartSpec":
        m = re.fullmatch(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*", part or "", re.ASCII)   # ASCII digits: "٠/٢" is no part
        if not m:
            raise UsageError(f"--part {part!r}: expected K/N (K counts from 0, e.g. $SLURM_NODEID/$SLURM_NNODES)")
        k, n = int(m.group(1)), int(m.group(2))
        if n < 1 or k >= n:
            raise UsageError(f"--part {part}: K must be in 0..N-1 and N at least 1")
        if n > 100000:
            raise UsageError(f"--part {part}: N is at most 100000")
        if not publish_id:
            raise UsageError("--part needs --publish-id ID, the same on every node (e.g. $SLURM_JOB_ID)")
        if not ID_RE.fullmatch(publish_id):
            raise UsageError(f"--publish-id {publish_id!r}: letters, digits and '._=+-', at most 64")
        return cls(k, n, publish_id)


@value
class FileRecord:
    size: int
    digests: list[str]
    mtime_ns: int = 0
    wrote: bool = False       # this part put the file in place (another part's copy was compared)

    def to_json(self) -> dict:
        return {"size": self.size, "digests": self.digests, "mtime_ns": self.mtime_ns, "wrote": self.wrote}

    @classmethod
    def from_json(cls, d: dict) -> "FileRecord":
        return cls(int(d["size"]), [str(x) for x in d["digests"]], int(d.get("mtime_ns", 0)), bool(d.get("wrote")))


@value
class PartRecord:
    part: int
    parts: int
    publish_id: str
    name: str
    host: str
    source: str
    files: dict[str, FileRecord]
    conflicts: list[dict] = field(default_factory=list)
    read_plan: dict | None = None   # the save-time read plan of this node's manifest (ManifestWriter)

    def to_bytes(self) -> bytes:
        doc = {"schema": RECORD_SCHEMA, "part": self.part, "parts": self.parts, "publish_id": self.publish_id,
               "name": self.name, "host": self.host, "source": self.source,
               "files": {r: f.to_json() for r, f in sorted(self.files.items())}, "conflicts": self.conflicts}
        if self.read_plan is not None:
            doc["read_plan"] = self.read_plan
        return (json.dumps(doc, indent=1) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "PartRecord":
        try:
            d = json.loads(data)
            if d.get("schema") != RECORD_SCHEMA:
                raise ValueError(f"schema {d.get('schema')!r}")
            return cls(int(d["part"]), int(d["parts"]), str(d["publish_id"]), str(d["name"]), str(d["host"]),
                       str(d["source"]), {str(r): FileRecord.from_json(f) for r, f in d["files"].items()},
                       list(d.get("conflicts") or []), d.get("read_plan") if isinstance(d.get("read_plan"), dict) else None)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PartRefused(f"{where}: not a readable part record ({exc}); nothing committed") from None


@value
class PartResult(AfterCommitResult):
    """What one part did (the `published` fact of `publish --part`)."""
    part: int
    parts: int
    publish_id: str
    dest: str
    name: str
    status: str = "part-done"       # committed | part-done | already-committed
    files: int = 0
    bytes: int = 0
    copied: int = 0                 # files this part put in place
    compared: int = 0               # files another node had placed; this node's copy compared equal
    resumed: int = 0                # files an earlier run of this part had already placed (journal)
    committer: int | None = None    # the part that committed (when known)
    seconds: float = 0.0


def hash_file(path: str, chunk: int = hashing.CHUNK_BYTES, progress=None) -> Copied:
    """The manifest's digests of one local regular file (bounded buffer; stops on CANCEL)."""
    cd = ChunkDigests(chunk)
    buf = hashing._buf()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        import stat
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        while True:
            if CANCEL.is_set():
                raise Cancelled(f"{path}: hashing cancelled")
            n = os.readv(fd, [buf[:cd.want(len(buf))]])
            if not n:
                break
            cd.update(buf[:n])
            if progress:
                progress(n)
    finally:
        os.close(fd)
    return Copied(os.path.basename(path), cd.total, cd.finish())


def staging_name(name: str, publish_id: str) -> str:
    return naming.config()["parts_dir"].format(name=name, id=publish_id)


class LocalParts:
    """The shared staging directory of one part publish on a POSIX filesystem (Lustre, GPFS, NFS
    with close-to-open consistency): every coordination step is a create-exclusive, a rename or
    a read of a file written whole."""

    def __init__(self, root: str, name: str, spec: PartSpec):
        self.root, self.name, self.spec = root, name, spec
        self.dir = os.path.join(root, staging_name(name, spec.publish_id))
        self.tree = os.path.join(self.dir, name)
        self.final = os.path.join(root, name)
        self.committed_by: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- life cycle --------------------------------------------------------------------------
    def open(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
            for d in ("", self.name, "tmp", "journal", "parts", "alive"):
                os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        except PermissionError:
            raise InputError(f"{self.root}: destination not writable (permission denied)") from None
        self.heartbeat()
        self._beat = threading.Thread(target=self._beat_loop, name="ckd-part-heartbeat", daemon=True)
        self._beat.start()

    def close(self) -> None:
        self._stop.set()

    def heartbeat(self) -> None:
        p = os.path.join(self.dir, "alive", str(self.spec.index))
        try:
            with open(p, "w") as fh:
                fh.write(f"{naming.HOST} {os.getpid()}\n")
        except OSError:
            pass  # the staging was removed (committed): the waiting loop finds out

    def _beat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if os.path.isdir(self.dir):
                self.heartbeat()

    # -- the committed checkpoint ------------------------------------------------------------
    def committed_id(self) -> str | None:
        """The publish ID DEST_ROOT/<name>'s manifest records ('' when it exists without one)."""
        if not os.path.lexists(self.final):
            return None
        try:
            doc = json.loads(read_regular(os.path.join(self.final, mf.NAME), mf.MAX_MANIFEST_BYTES))
            self.committed_by = doc.get("committed_by")
            return str(doc.get("publish_id") or "")
        except (OSError, ValueError, AttributeError):
            return ""

    # -- one part's files --------------------------------------------------------------------
    def journal(self) -> dict[str, FileRecord]:
        p = os.path.join(self.dir, "journal", f"{self.spec.index}.jsonl")
        out: dict[str, FileRecord] = {}
        try:
            data = read_regular(p, 256 << 20)
        except FileNotFoundError:
            return out
        for line in data.splitlines():
            try:
                d = json.loads(line)
                out[str(d["rel"])] = FileRecord.from_json(d)
            except (ValueError, KeyError, TypeError):
                break  # a torn last line (killed mid-append): everything before it stands
        return out

    def journal_add(self, rel: str, rec: FileRecord) -> None:
        p = os.path.join(self.dir, "journal", f"{self.spec.index}.jsonl")
        line = (json.dumps({"rel": rel, **rec.to_json()}) + "\n").encode()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def staged_size(self, rel: str) -> int | None:
        try:
            st = os.lstat(os.path.join(self.tree, rel))
        except FileNotFoundError:
            return None
        return st.st_size

    def put(self, src: str, rel: str, progress) -> tuple[Copied, bool]:
        """Copy src to <name>/<rel> unless a copy is already there.  Returns (this node's digests,
        whether this part wrote it).  A copy already there is read and must equal this node's."""
        dst = os.path.join(self.tree, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.lexists(dst):
            tmp = os.path.join(self.dir, "tmp", f"{self.spec.index}.{os.getpid()}.{secrets.token_hex(4)}")
            try:
                c = copy_file(src, tmp, rel, progress=progress)
                try:
                    rename_noreplace(tmp, dst)
                    return c, True
                except FileExistsError:
                    pass  # another node placed it meanwhile: compare below
            finally:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        else:
            c = hash_file(src, progress=progress)
        return Copied(rel, c.size, c.digests), False

    def staged_digests(self, rel: str) -> Copied:
        return hash_file(os.path.join(self.tree, rel))

    def writer_of(self, rel: str) -> str | None:
        """'part K on HOST' that put <rel> in place (from the journals), if recorded."""
        jdir = os.path.join(self.dir, "journal")
        for e in sorted(os.listdir(jdir)):
            if not e.endswith(".jsonl"):
                continue
            k = e[:-len(".jsonl")]
            try:
                data = read_regular(os.path.join(jdir, e), 256 << 20)
            except OSError:
                continue
            for line in data.splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    break
                if d.get("rel") == rel and d.get("wrote"):
                    return f"part {k} ({self._host_of(k)})"
        return None

    def _host_of(self, k: str) -> str:
        try:
            return open(os.path.join(self.dir, "alive", k)).read().split()[0]
        except (OSError, IndexError):
            return "host unknown"

    def write_record(self, rec: PartRecord) -> None:
        replace_file(os.path.join(self.dir, "parts", f"{rec.part}.json"), rec.to_bytes())

    def records(self) -> dict[int, bytes]:
        out = {}
        pdir = os.path.join(self.dir, "parts")
        for e in os.listdir(pdir):
            if e.endswith(".json") and e[:-5].isdigit():
                out[int(e[:-5])] = read_regular(os.path.join(pdir, e), mf.MAX_MANIFEST_BYTES)
        return out

    def record_count(self) -> set[int]:
        try:
            return {int(e[:-5]) for e in os.listdir(os.path.join(self.dir, "parts"))
                    if e.endswith(".json") and e[:-5].isdigit()}
        except FileNotFoundError:
            return set()

    # -- election and failure ------------------------------------------------------------------
    def elect(self) -> bool:
        p = os.path.join(self.dir, "commit")
        doc = json.dumps({"part": self.spec.index, "host": naming.HOST, "pid": os.getpid(),
                          "start": naming.start_time(os.getpid())}).encode()
        try:
            write_new(p, doc)
            return True
        except FileExistsError:
            pass
        try:
            own = json.loads(read_regular(p, 4096))
        except (OSError, ValueError):
            return False
        if own.get("host") == naming.HOST and not naming.pid_alive(int(own.get("pid", 0)), own.get("start")):
            return self._take_over(p, own, doc)  # the committer died on this host
        return False

    def _take_over(self, p: str, dead: dict, doc: bytes) -> bool:
        """Replace a dead committer's claim (its rename either happened or not).  Two parts on its
        host may see it dead at once (a waiting part and a re-run of the dead one, seen in CI): each
        read it, the first replaced it, and the second, unlinking what it had read as dead, removed
        the first's fresh claim, so both committed and the later one failed on the vanished tree.
        Serialized by a lock and re-read under it, the claim is replaced only while it is still the
        dead one.  Parts on other hosts never take over (they cannot tell a pid is dead), and they
        claim with O_EXCL only, so they cannot slip in while the dead claim stands."""
        import fcntl
        fd = os.open(os.path.join(self.dir, "elect.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read, an unlink and a write: milliseconds
            try:
                now = json.loads(read_regular(p, 4096))
            except FileNotFoundError:
                now = None
            except (OSError, ValueError):
                return False
            if now is not None:
                if now != dead:
                    return False  # another part took over first: it commits
                os.unlink(p)
            try:
                write_new(p, doc)
                return True
            except FileExistsError:
                return False
        finally:
            os.close(fd)  # releases the lock

    def committer(self) -> int | None:
        try:
            return int(json.loads(read_regular(os.path.join(self.dir, "commit"), 4096))["part"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def failed(self) -> str | None:
        try:
            return str(json.loads(read_regular(os.path.join(self.dir, "failed.json"), 1 << 20))["message"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return "another part refused the commit"

    def fail(self, message: str) -> None:
        replace_file(os.path.join(self.dir, "failed.json"), json.dumps({"message": message}).encode())
        try:
            os.unlink(os.path.join(self.dir, "commit"))
        except FileNotFoundError:
            pass

    def clear_failure(self) -> None:
        for f in ("failed.json", "commit"):
            try:
                os.unlink(os.path.join(self.dir, f))
            except FileNotFoundError:
                pass

    # -- commit ----------------------------------------------------------------------------
    def listing(self) -> dict[str, int]:
        _, files = list_tree(self.tree)
        files.pop(mf.NAME, None)  # a committer killed before its rename left one; the new one replaces it
        return files

    def seal_and_rename(self, manifest: bytes) -> None:
        p = os.path.join(self.tree, mf.NAME)
        try:
            os.unlink(p)  # a manifest copied from a node is replaced by the merged one
        except FileNotFoundError:
            pass
        write_new(p, manifest)
        dirs, _ = list_tree(self.tree)
        from .copier import fsync_tree_dirs
        fsync_tree_dirs(self.tree, dirs)
        faults.point("manifest")
        try:
            rename_noreplace(self.tree, self.final)
        except FileExistsError:
            raise PartRefused(f"{self.final}: appeared while the parts were assembling (another publisher?); "
                              f"nothing replaced") from None
        fsync_dir(self.root)
        faults.point("rename")

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def clean_stale(self, stale_after: float, notes: list[str]) -> list[str]:
        if not os.path.isdir(self.root):
            return []
        return clean_stale(self.root, self.name, self.spec.publish_id, stale_after, notes)


def clean_stale(root: str, name: str, keep_id: str, stale_after: float, notes: list[str]) -> list[str]:
    """Remove staging directories of other part publishes of `name` that no part has touched for
    `stale_after` seconds (every live part touches alive/K every couple of seconds)."""
    cleaned = []
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return cleaned
    for e in sorted(entries):
        own = naming.parse_parts(e)
        if not own or own["name"] != name or own["id"] == keep_id:
            continue
        age = staging_age(os.path.join(root, e))
        if age is None or age < stale_after:
            notes.append(f"left alone: {e} (another part publish of {name}, active "
                         f"{'recently' if age is not None else 'at an unknown time'})")
            continue
        shutil.rmtree(os.path.join(root, e), ignore_errors=True)
        cleaned.append(e)
    if cleaned:
        fsync_dir(root)
    return cleaned


def staging_age(path: str) -> float | None:
    """Seconds since any part of this staging last showed life (heartbeat or record)."""
    newest = None
    for sub in ("alive", "parts", ""):
        try:
            for e in os.scandir(os.path.join(path, sub)):
                m = e.stat(follow_symlinks=False).st_mtime
                newest = m if newest is None else max(newest, m)
        except OSError:
            continue
    return None if newest is None else max(0.0, time.time() - newest)


def merge_records(recs: dict[int, PartRecord], where) -> dict[str, FileRecord]:
    """One table from N records; a file two nodes hold with different bytes refuses the commit
    and names both nodes."""
    merged: dict[str, tuple[int, FileRecord]] = {}
    problems = []
    for k in sorted(recs):
        r = recs[k]
        for c in r.conflicts:
            problems.append(f"{c.get('rel')}: part {k} ({r.host}) {c.get('detail')}")
        for rel, f in r.files.items():
            if rel not in merged:
                merged[rel] = (k, f)
                continue
            k0, f0 = merged[rel]
            if (f0.size, f0.digests) != (f.size, f.digests):
                problems.append(f"{rel}: part {k0} ({recs[k0].host}) and part {k} ({r.host}) hold different "
                                f"bytes ({f0.size} vs {f.size} bytes, xxh3 {f0.digests[0][:12]} vs "
                                f"{f.digests[0][:12]})")
    if problems:
        more = f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""
        raise PartRefused(f"{where}: conflicting copies, nothing committed: " + "; ".join(problems[:4]) + more)
    return {rel: f for rel, (_, f) in merged.items()}


def run_part(src: str, dest_root: str, name: str, spec: PartSpec, *, verify, tracker: str, keep_last, keep_every,
             workers, progress_factory, timeout: float, after_commit_fn, stage: "LocalParts") -> PartResult:
    """One node's part: copy, record, then elect/commit or wait.  `verify(path) -> (layout, reasons)`
    is the structural verify of the assembled tree (its family and error reasons; none = fine).
    Raises PartRefused, PartTimeout or UsageError; never touches the tracker unless this part committed."""
    t0 = time.monotonic()
    st = stage
    res = PartResult(spec.index, spec.count, spec.publish_id, dest_root, name)
    if begin(st, res):
        return _late(st, res, t0, "already committed", after_commit_fn, tracker, keep_last, keep_every)
    try:
        _copy_part(st, src, spec, name, res, workers, progress_factory)
        faults.point("part-record")
        return _finish(st, res, spec, name, verify, tracker, keep_last, keep_every, t0 + timeout, t0,
                       after_commit_fn)
    finally:
        st.close()


def begin(st: LocalParts, res: PartResult) -> bool:
    """Open this part's stage; True when DEST_ROOT/<name> is already committed under this ID."""
    done = st.committed_id()
    if done == st.spec.publish_id:
        return True
    if done is not None:
        raise UsageError(f"{st.final} exists (not from publish id {st.spec.publish_id}); refusing to overwrite a "
                         f"published checkpoint (use --name to publish under another name)")
    res.cleaned = st.clean_stale(float(naming.config()["parts_stale_seconds"]), res.notes)
    st.open()
    if st.failed() is not None:
        st.clear_failure()  # a re-run after a refused commit starts the judgement again
    return False


def copy_part(st: LocalParts, src: str, res: PartResult, workers=None, progress_factory=None) -> None:
    """This node's files into the stage and its record written (no election: publish_distributed
    uses the process group as the barrier and global rank 0 commits)."""
    from ..report.progress import Progress
    _copy_part(st, src, st.spec, st.name, res, workers,
               progress_factory or (lambda total, label: Progress(total, label, enabled=False)))
    faults.point("part-record")


def commit_all(st: LocalParts, res: PartResult, verify, after_commit_fn, tracker, keep_last, keep_every) -> None:
    """Commit once every record is in (the caller knows it is); then after-commit and cleanup."""
    missing = sorted(set(range(st.spec.count)) - st.record_count())
    if missing:
        raise PartRefused(f"{st.dir}: no record from parts {missing[:8]}; nothing committed")
    _commit(st, res, st.spec, st.name, verify)
    res.status, res.committer = "committed", st.spec.index
    try:
        after_commit_fn(res, tracker, keep_last, keep_every)
    finally:
        st.remove()


def _copy_part(st: LocalParts, src: str, spec: PartSpec, name: str, res: PartResult, workers, progress_factory):
    before = snapshot(src)
    _, files = list_tree(src)
    files.pop(mf.NAME, None)  # the merged manifest is computed from every node's bytes
    res.files, res.bytes = len(files), sum(files.values())
    journal = st.journal()
    todo = []
    recs: dict[str, FileRecord] = {}
    for rel in sorted(files, key=lambda r: -files[r]):
        j = journal.get(rel)
        mt = before[rel][1] if rel in before else 0
        if j and j.size == files[rel] and j.mtime_ns == mt and st.staged_size(rel) == j.size:
            recs[rel] = j
            res.resumed += 1
        else:
            todo.append(rel)
    conflicts: list[dict] = []
    lock = threading.Lock()
    prog = progress_factory(sum(files[r] for r in todo), f"publishing part {spec.index}/{spec.count} of {name}")

    def one(rel: str) -> None:
        c, wrote = st.put(os.path.join(src, rel), rel, prog)
        rec = FileRecord(c.size, c.digests, before[rel][1], wrote)
        if not wrote:
            there = st.staged_digests(rel)
            if (there.size, there.digests) != (c.size, c.digests):
                by = st.writer_of(rel) or "another part"
                with lock:
                    conflicts.append({"rel": rel, "detail": f"holds different bytes from the copy {by} placed "
                                      f"({c.size} vs {there.size} bytes)"})
        st.journal_add(rel, rec)
        with lock:
            recs[rel] = rec
            if wrote:
                res.copied += 1
            else:
                res.compared += 1
        if wrote:
            faults.point("copy")

    try:
        n = copy_workers(workers, len(todo))
        if n <= 1 or len(todo) <= 1:
            for rel in todo:
                one(rel)
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="ckd-part") as ex:
                gather({rel: ex.submit(one, rel) for rel in todo})
    finally:
        prog.close()
    changed = snapshot_diff(before, snapshot(src))
    if changed:
        raise SourceChanged(f"source changed while publishing: {changed}")
    plan = _check_save_time_manifest(src, recs)
    st.write_record(PartRecord(spec.index, spec.count, spec.publish_id, name, naming.HOST, src, recs, conflicts,
                               plan))


def _check_save_time_manifest(src: str, recs: dict[str, FileRecord]) -> dict | None:
    """A manifest written while saving (ManifestWriter on the coordinator's node) lists every
    rank's files; each file this node holds must still have the bytes it had at save time.
    Returns its read plan (which ranks held each key), for the merged manifest to keep."""
    path = os.path.join(src, mf.NAME)
    if not os.path.exists(path):
        return None
    try:
        raw = read_regular(path, mf.MAX_MANIFEST_BYTES)
        want = mf.parse(raw, mf.NAME)
    except (mf.ManifestError, ValueError, OSError):
        return None  # verify reports a corrupt manifest (CKD154); the merged manifest is computed afresh
    plan = mf.read_plan_of(raw)
    for rel, e in want.items():
        r = recs.get(rel)
        if r is None or e.chunk_bytes != hashing.CHUNK_BYTES:
            continue  # held by another node (or another chunking): judged there
        if r.size != e.size or r.digests != e.digests:
            raise SourceChanged(f"{os.path.join(src, rel)}: this node's bytes differ from the {mf.NAME} written "
                                f"at save time (corrupted on local disk since the save); nothing committed")
    return plan


def _finish(st, res, spec, name, verify, tracker, keep_last, keep_every, deadline, t0,
            after_commit_fn) -> PartResult:
    while True:
        msg = st.failed()
        if msg is not None:
            raise PartRefused(msg)
        done = st.committed_id()
        if done == spec.publish_id:
            res.status, res.committer = "part-done", st.committed_by
            res.seconds = time.monotonic() - t0
            return res
        have = st.record_count()
        if have >= set(range(spec.count)) and st.elect():
            commit_all(st, res, verify, after_commit_fn, tracker, keep_last, keep_every)
            res.seconds = time.monotonic() - t0
            return res
        if time.monotonic() > deadline:
            missing = sorted(set(range(spec.count)) - have)
            what = (f"parts {', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''} never arrived"
                    if missing else f"part {st.committer()} was committing and did not finish")
            raise PartTimeout(f"{st.dir}: {what} within --timeout; nothing committed, tracker untouched "
                              f"(re-run the missing parts with the same --publish-id; this part's files stay "
                              f"staged and are not copied again)")
        time.sleep(POLL_SECONDS)


def _commit(st: LocalParts, res: PartResult, spec: PartSpec, name: str, verify) -> None:
    try:
        recs = {}
        for k, data in st.records().items():
            r = PartRecord.from_bytes(data, os.path.join(st.dir, "parts", f"{k}.json"))
            if (r.parts, r.publish_id, r.name) != (spec.count, spec.publish_id, name):
                raise PartRefused(f"part {k} ({r.host}) was run as part of {r.parts} for {r.name!r}, id "
                                  f"{r.publish_id!r}; every part must agree (here {spec.count}, {name!r})")
            recs[k] = r
        merged = merge_records(recs, st.dir)
        listed = st.listing()
        extra = sorted(set(listed) - set(merged))
        short = sorted(r for r in merged if listed.get(r) != merged[r].size)
        if extra or short:
            raise PartRefused(f"{st.tree}: the assembled tree differs from the part records "
                              f"({'unrecorded ' + ', '.join(extra[:3]) if extra else ''}"
                              f"{'; ' if extra and short else ''}"
                              f"{'missing or wrong size ' + ', '.join(short[:3]) if short else ''}); nothing committed")
        if isinstance(st, ObjectParts):
            st.place_markers()  # the framework's markers go up after every data object (marker last)
        layout_name, reasons = verify(st.tree)
        if reasons:
            raise PartRefused(f"{name}: the checkpoint assembled from {spec.count} parts fails verification: "
                              + "; ".join(reasons[:4]) + "; nothing committed, tracker untouched")
        from .flow import _manifest
        plan = next((r.read_plan for _, r in sorted(recs.items()) if r.read_plan is not None), None)
        st.seal_and_rename(_manifest(merged, layout_name, hashing.CHUNK_BYTES, extra={
            "publish_id": spec.publish_id, "parts": {str(k): r.host for k, r in sorted(recs.items())},
            "committed_by": spec.index, **({"read_plan": plan} if plan is not None else {})}))
        res.files, res.bytes = len(merged), sum(f.size for f in merged.values())
    except PartRefused as exc:
        st.fail(str(exc))
        raise
    except (KeyboardInterrupt, SystemExit):
        if not os.path.lexists(st.final) or st.committed_id() != spec.publish_id:
            try:
                os.unlink(os.path.join(st.dir, "commit"))  # let a re-run commit
            except FileNotFoundError:
                pass
        raise


def _late(st, res, t0, how, after_commit_fn, tracker, keep_last, keep_every) -> PartResult:
    """DEST_ROOT/<name> is committed under this ID: finish the after-commit (idempotent: a tracker
    never moves backwards) in case the committer died before it, clear the staging."""
    res.status = "already-committed"
    res.notes.append(f"{st.final} is {how} under publish id {st.spec.publish_id}; nothing copied")
    after_commit_fn(res, tracker, keep_last, keep_every)
    if os.path.isdir(st.dir):
        st.remove()
    res.seconds = time.monotonic() - t0
    return res


class ObjectParts(LocalParts):
    """The same protocol on an object store (fsspec: S3, GCS, ...), with the marker-last commit
    instead of a rename.  Data objects go straight to <name>/<rel> (a multipart upload appears
    whole on close) with <name>/.ckptdoctor-publishing present, so an unfinished assembly is
    visibly uncommitted (CKD201); the framework's markers (`.metadata`, metadata.json, ...) wait in
    the staging prefix and are copied into place by the committer after every data object's size is
    confirmed; the manifest, created exclusively, is the commit.  Coordination objects (journal
    entries, records, the election) are whole-object PUTs under the staging prefix."""

    def __init__(self, fs, root: str, name: str, spec: PartSpec, markers: set[str]):
        self.fs, self.markers = fs, markers
        self.root, self.name, self.spec = root.rstrip("/"), name, spec
        self.dir = f"{self.root}/{staging_name(name, spec.publish_id)}"
        self.final = self.tree = f"{self.root}/{name}"
        self.committed_by = None
        self._stop = threading.Event()
        self._beat = None

    def _cat(self, path: str, limit: int) -> bytes:
        return self.fs.cat_file(path, start=0, end=limit)

    def open(self) -> None:
        self.fs.pipe_file(f"{self.final}/{naming.in_progress_object()}",
                          json.dumps({"publish_id": self.spec.publish_id, "host": naming.HOST}).encode())
        self.heartbeat()
        self._beat = threading.Thread(target=self._beat_loop, name="ckd-part-heartbeat", daemon=True)
        self._beat.start()

    def heartbeat(self) -> None:
        try:
            self.fs.pipe_file(f"{self.dir}/alive/{self.spec.index}", f"{naming.HOST} {os.getpid()}\n".encode())
        except Exception:  # noqa: BLE001 - a missed heartbeat only makes the staging look older
            pass

    def _beat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self.heartbeat()

    def committed_id(self) -> str | None:
        try:
            doc = json.loads(self._cat(f"{self.final}/{mf.NAME}", mf.MAX_MANIFEST_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return ""
        self.committed_by = doc.get("committed_by") if isinstance(doc, dict) else None
        return str(doc.get("publish_id") or "") if isinstance(doc, dict) else ""

    def _target(self, rel: str) -> str:
        return f"{self.dir}/markers/{rel}" if rel in self.markers else f"{self.final}/{rel}"

    def journal(self) -> dict[str, FileRecord]:
        out: dict[str, FileRecord] = {}
        base = f"{self.dir}/journal/{self.spec.index}"
        try:
            names = self.fs.find(base)
        except FileNotFoundError:
            return out
        for p in names:
            try:
                d = json.loads(self._cat(p, 1 << 20))
                out[str(d["rel"])] = FileRecord.from_json(d)
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def journal_add(self, rel: str, rec: FileRecord) -> None:
        import hashlib
        key = hashlib.sha1(rel.encode()).hexdigest()
        self.fs.pipe_file(f"{self.dir}/journal/{self.spec.index}/{key}.json",
                          json.dumps({"rel": rel, **rec.to_json()}).encode())

    def staged_size(self, rel: str) -> int | None:
        try:
            return int(self.fs.info(self._target(rel))["size"])
        except FileNotFoundError:
            return None

    def put(self, src: str, rel: str, progress) -> tuple[Copied, bool]:
        target = self._target(rel)
        if self.fs.exists(target):
            c = hash_file(src, progress=progress)
            return Copied(rel, c.size, c.digests), False
        faults.point("put")  # two nodes may both find no object and both upload: the records then disagree
        return upload_file(self.fs, src, target, rel, progress), True

    def staged_digests(self, rel: str) -> Copied:
        cd = ChunkDigests()
        with self.fs.open(self._target(rel), "rb") as fh:
            while b := fh.read(8 << 20):
                cd.feed(b)
        return Copied(rel, cd.total, cd.finish())

    def writer_of(self, rel: str) -> str | None:
        return None  # object journals are per file and per part; the records name both sides at commit

    def write_record(self, rec: PartRecord) -> None:
        self.fs.pipe_file(f"{self.dir}/parts/{rec.part}.json", rec.to_bytes())

    def _ls(self, sub: str) -> list[str]:
        from .flow import _ls_fresh
        try:
            return [it["name"].rstrip("/").rsplit("/", 1)[-1] for it in _ls_fresh(self.fs, f"{self.dir}/{sub}")
                    if it.get("type") != "directory"]
        except FileNotFoundError:
            return []

    def records(self) -> dict[int, bytes]:
        return {int(e[:-5]): self._cat(f"{self.dir}/parts/{e}", mf.MAX_MANIFEST_BYTES)
                for e in self._ls("parts") if e.endswith(".json") and e[:-5].isdigit()}

    def record_count(self) -> set[int]:
        return {int(e[:-5]) for e in self._ls("parts") if e.endswith(".json") and e[:-5].isdigit()}

    def elect(self, retry: bool = True) -> bool:
        doc = json.dumps({"part": self.spec.index, "host": naming.HOST, "pid": os.getpid(),
                          "start": naming.start_time(os.getpid())}).encode()
        path = f"{self.dir}/commit"
        try:
            self.fs.pipe_file(path, doc, mode="create")
            return True
        except FileExistsError:
            pass
        except TypeError:  # no exclusive create in this filesystem: check, then write (a small race)
            if not self.fs.exists(path):
                self.fs.pipe_file(path, doc)
                return json.loads(self._cat(path, 4096)).get("part") == self.spec.index
        try:
            own = json.loads(self._cat(path, 4096))
        except (OSError, ValueError):
            return False
        if retry and own.get("host") == naming.HOST and \
                not naming.pid_alive(int(own.get("pid", 0)), own.get("start")):
            self.fs.rm_file(path)  # the committer died on this host before the manifest: take over
            return self.elect(retry=False)
        return False

    def committer(self) -> int | None:
        try:
            return int(json.loads(self._cat(f"{self.dir}/commit", 4096))["part"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def failed(self) -> str | None:
        try:
            return str(json.loads(self._cat(f"{self.dir}/failed.json", 1 << 20))["message"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return "another part refused the commit"

    def fail(self, message: str) -> None:
        self.fs.pipe_file(f"{self.dir}/failed.json", json.dumps({"message": message}).encode())
        self.clear_failure(keep_failed=True)

    def clear_failure(self, keep_failed: bool = False) -> None:
        for f in (("commit",) if keep_failed else ("failed.json", "commit")):
            try:
                self.fs.rm_file(f"{self.dir}/{f}")
            except FileNotFoundError:
                pass

    def listing(self) -> dict[str, int]:
        from ..io.fs import FsspecStorage, walk_files
        out = walk_files(FsspecStorage(self.final, fs=self.fs))
        out.pop(naming.in_progress_object(), None)
        out.pop(mf.NAME, None)
        try:
            out.update(walk_files(FsspecStorage(f"{self.dir}/markers", fs=self.fs)))
        except FileNotFoundError:
            pass
        return out

    def place_markers(self) -> None:
        """The committer copies the agreed framework markers into place (after every data object)."""
        for rel in sorted(self.markers):
            src = f"{self.dir}/markers/{rel}"
            if self.fs.exists(src):
                self.fs.copy(src, f"{self.final}/{rel}")
        faults.point("upload")

    def seal_and_rename(self, manifest: bytes) -> None:
        try:
            self.fs.pipe_file(f"{self.final}/{mf.NAME}", manifest, mode="create")
        except TypeError:
            if self.fs.exists(f"{self.final}/{mf.NAME}"):
                raise PartRefused(f"{self.final}: another publisher committed first; nothing overwritten") from None
            self.fs.pipe_file(f"{self.final}/{mf.NAME}", manifest)
        except FileExistsError:
            raise PartRefused(f"{self.final}: another publisher committed first; nothing overwritten") from None
        faults.point("manifest")
        self.fs.rm_file(f"{self.final}/{naming.in_progress_object()}")

    def remove(self) -> None:
        try:
            self.fs.rm(self.dir, recursive=True)
        except FileNotFoundError:
            pass

    def clean_stale(self, stale_after: float, notes: list[str]) -> list[str]:
        return []  # object stores have no cheap directory ages; verify reports the leftover prefix (CKD201)
