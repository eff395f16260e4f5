"""The shared staging of a part publish on a POSIX filesystem (Lustre, GPFS, NFS with
close-to-open consistency), and the clean-up of stale stagings."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time

from ...engine.errors import InputError
from ...io import hashing
from ...io.atomic import fsync_dir, rename_noreplace, replace_file, write_new
from ...io.fs import read_regular
from ...layouts import manifest as mf
from .. import faults, naming
from ..copier import CANCEL, Cancelled, ChunkDigests, Copied, copy_file, list_tree
from .records import FileRecord, PartRecord, PartSpec, PartTaken

HEARTBEAT_SECONDS = 2.0


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
        self._init_state()

    def _init_state(self) -> None:
        """What a part knows of the protocol's run, the same on every store."""
        self.committed_by: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._beats = 0
        self._seen: tuple[bytes | None, float] = (None, 0.0)   # the committer's last heartbeat, when it changed

    def _cat(self, path: str, limit: int) -> bytes:
        return read_regular(path, limit)

    # -- life cycle --------------------------------------------------------------------------
    def open(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
            for d in ("", self.name, "tmp", "journal", "parts", "alive", "conflicts"):
                os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        except PermissionError:
            raise InputError(f"{self.root}: destination not writable (permission denied)") from None
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        self.heartbeat()
        self._beat = threading.Thread(target=self._beat_loop, name="ckd-part-heartbeat", daemon=True)
        self._beat.start()

    def close(self) -> None:
        self._stop.set()

    def heartbeat(self) -> None:
        p = os.path.join(self.dir, "alive", str(self.spec.index))
        self._beats += 1
        try:
            with open(p, "w") as fh:
                fh.write(self._beat_line())
        except OSError:
            pass  # the staging was removed (committed): the waiting loop finds out

    def _beat_line(self) -> str:
        # a counter, so a reader on another host tells a live part by the content changing (its own
        # clock, never a comparison of two hosts' clocks or of an object store's timestamps)
        return f"{naming.HOST} {os.getpid()} {self._beats}\n"

    def _staging_exists(self) -> bool:
        return os.path.isdir(self.dir)

    def _beat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if self._staging_exists():
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
            return self._cat(f"{self.dir}/alive/{k}", 4096).split()[0].decode(errors="replace")
        except (OSError, IndexError):
            return "host unknown"

    def write_record(self, rec: PartRecord) -> None:
        replace_file(os.path.join(self.dir, "parts", f"{rec.part}.json"), rec.to_bytes())

    def withdraw_record(self) -> None:
        """A re-run of this part takes its earlier record away before reading its source again."""
        try:
            os.unlink(os.path.join(self.dir, "parts", f"{self.spec.index}.json"))
        except FileNotFoundError:
            return
        fsync_dir(os.path.join(self.dir, "parts"))

    def unplace(self, rel: str) -> None:
        try:
            os.unlink(os.path.join(self.tree, rel))
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(os.path.join(self.tree, rel)))

    def record_conflicts(self, conflicts: list[dict]) -> None:
        """Append-only: one new file per sighting, never rewritten, so no later record drops it."""
        doc = json.dumps([{"part": self.spec.index, "host": naming.HOST, **c} for c in conflicts]).encode()
        write_new(os.path.join(self.dir, "conflicts",
                               f"{self.spec.index}.{os.getpid()}.{secrets.token_hex(4)}.json"), doc)

    def conflicts(self) -> list[dict]:
        out: list[dict] = []
        for e in sorted(self._names("conflicts")):
            try:
                got = json.loads(self._cat(f"{self.dir}/conflicts/{e}", 1 << 20))
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                got = [{"part": "?", "host": "?", "rel": e, "detail": "unreadable conflict record"}]  # fail closed
            out.extend(c for c in (got if isinstance(got, list) else [got]) if isinstance(c, dict))
        return out

    def _names(self, sub: str) -> list[str]:
        try:
            return os.listdir(os.path.join(self.dir, sub))
        except FileNotFoundError:
            return []

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
        c = self.claim()
        try:
            return int(c["part"]) if c else None
        except (KeyError, TypeError, ValueError):
            return None

    def claim(self) -> dict | None:
        """The election's winner (part, host, pid, start), or None."""
        try:
            doc = json.loads(self._cat(f"{self.dir}/commit", 4096))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def after_commit_pending(self) -> bool:
        """The checkpoint is committed and the committer has not yet finished its after-commit
        (it removes the staging, claim included, as its last step)."""
        return self.claim() is not None

    def committer_gone(self) -> bool:
        """The committer has ended: on this host its pid is gone; on another host its heartbeat
        has not changed for five beats of this host's clock."""
        c = self.claim()
        if c is None:
            return True
        if c.get("host") == naming.HOST:
            try:
                return not naming.pid_alive(int(c.get("pid", 0)), c.get("start"))
            except (TypeError, ValueError):
                return True
        try:
            beat = self._cat(f"{self.dir}/alive/{c.get('part')}", 4096)
        except (OSError, ValueError):
            beat = b""
        now = time.monotonic()
        if beat != self._seen[0]:
            self._seen = (beat, now)
            return False
        return now - self._seen[1] > 5 * HEARTBEAT_SECONDS

    def before_verify(self) -> None:
        """Nothing on a filesystem: the framework's markers are already inside the tree."""

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
        from ..copier import fsync_tree_dirs
        fsync_tree_dirs(self.tree, dirs)
        faults.point("manifest")
        try:
            rename_noreplace(self.tree, self.final)
        except FileExistsError:
            raise PartTaken(f"{self.final}: appeared while the parts were assembling (another publisher?); "
                            f"nothing replaced and this publish can never commit") from None
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
