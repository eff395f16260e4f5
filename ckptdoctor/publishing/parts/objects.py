"""The part publish protocol on an object store (fsspec: S3, GCS, ...)."""
from __future__ import annotations

import json
import os

from ...layouts import manifest as mf
from .. import faults, naming
from ..copier import ChunkDigests, Copied, upload_file
from .local import LocalParts, hash_file, staging_name
from .records import FileRecord, PartRecord, PartSpec, PartTaken


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
        self._init_state()

    def _cat(self, path: str, limit: int) -> bytes:
        return self.fs.cat_file(path, start=0, end=limit)

    def _names(self, sub: str) -> list[str]:
        return self._ls(sub)

    def open(self) -> None:
        self.fs.pipe_file(f"{self.final}/{naming.in_progress_object()}",
                          json.dumps({"publish_id": self.spec.publish_id, "host": naming.HOST}).encode())
        self._start_heartbeat()

    def heartbeat(self) -> None:
        self._beats += 1
        try:
            self.fs.pipe_file(f"{self.dir}/alive/{self.spec.index}", self._beat_line().encode())
        except Exception:  # noqa: BLE001 - a missed heartbeat only makes the staging look older
            pass

    def _staging_exists(self) -> bool:
        return True   # a prefix has no existence of its own to test; close() stops the beats

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
        """'part K on HOST' whose journal says it uploaded <rel>: one read per part that has run
        (alive/ lists them), only when a conflict is being reported."""
        import hashlib
        key = hashlib.sha1(rel.encode()).hexdigest()
        for k in sorted(self._ls("alive"), key=lambda e: (len(e), e)):
            if not k.isdigit() or int(k) == self.spec.index:
                continue
            try:
                if json.loads(self._cat(f"{self.dir}/journal/{k}/{key}.json", 1 << 20)).get("wrote"):
                    return f"part {k} ({self._host_of(k)})"
            except (OSError, ValueError, AttributeError):
                continue
        return None

    def write_record(self, rec: PartRecord) -> None:
        self.fs.pipe_file(f"{self.dir}/parts/{rec.part}.json", rec.to_bytes())

    def withdraw_record(self) -> None:
        try:
            self.fs.rm_file(f"{self.dir}/parts/{self.spec.index}.json")
        except FileNotFoundError:
            pass

    def unplace(self, rel: str) -> None:
        try:
            self.fs.rm_file(self._target(rel))
        except FileNotFoundError:
            pass

    def record_conflicts(self, conflicts: list[dict]) -> None:
        import secrets
        doc = json.dumps([{"part": self.spec.index, "host": naming.HOST, **c} for c in conflicts]).encode()
        self.fs.pipe_file(f"{self.dir}/conflicts/{self.spec.index}.{os.getpid()}.{secrets.token_hex(4)}.json", doc)

    def before_verify(self) -> None:
        self.place_markers()  # the framework's markers go up after every data object (marker last)

    def _ls(self, sub: str) -> list[str]:
        from ..flow import _ls_fresh
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
        from ...io.fs import FsspecStorage, walk_files
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
                raise PartTaken(f"{self.final}: another publisher committed first; nothing overwritten") from None
            self.fs.pipe_file(f"{self.final}/{mf.NAME}", manifest)
        except FileExistsError:
            raise PartTaken(f"{self.final}: another publisher committed first; nothing overwritten") from None
        faults.point("manifest")
        self.fs.rm_file(f"{self.final}/{naming.in_progress_object()}")

    def remove(self) -> None:
        try:
            self.fs.rm(self.dir, recursive=True)
        except FileNotFoundError:
            pass

    def clean_stale(self, stale_after: float, notes: list[str]) -> list[str]:
        return []  # object stores have no cheap directory ages; verify reports the leftover prefix (CKD201)
