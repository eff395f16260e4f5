"""What the parts of one part publish agree on: the options (PartSpec), each part's record of its
files (PartRecord), the outcome (PartResult), the errors, and the merge of N records into one table."""
from __future__ import annotations

import json
import re

from ...engine.errors import EXIT_TAKEN, CkptDoctorError, TransientError, UsageError
from ...values import value, field
from ..flow import AfterCommitResult

RECORD_SCHEMA = "ckptdoctor.part/v1"
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,63}", re.ASCII)


class PartRefused(CkptDoctorError):
    """The assembled checkpoint cannot be committed (conflicting copies, missing shards, verify
    errors); nothing was committed and the tracker is untouched."""
    exit_code = 1


class PartTimeout(TransientError):
    """The other parts did not arrive within --timeout; nothing committed (exit 75: re-run)."""


class PartTaken(PartRefused):
    """Another publish id committed this name first: this publish can never commit, so a requeue
    would only fail again (exit 73, not 75)."""
    exit_code = EXIT_TAKEN


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


def merge_records(recs: dict[int, PartRecord], where, extra_conflicts=()) -> dict[str, FileRecord]:
    """One table from N records; a file two nodes hold with different bytes refuses the commit
    and names both nodes.  `extra_conflicts` are the staging's append-only conflict sightings
    (dicts with part, host, rel, detail): a record rewritten by a later run of its part cannot
    drop a conflict an earlier run of any part saw."""
    merged: dict[str, tuple[int, FileRecord]] = {}
    problems: list[str] = []
    seen: set[str] = set()

    def note(text: str) -> None:
        if text not in seen:
            seen.add(text)
            problems.append(text)

    for c in extra_conflicts:
        note(f"{c.get('rel')}: part {c.get('part')} ({c.get('host')}) {c.get('detail')}")
    for k in sorted(recs):
        r = recs[k]
        for c in r.conflicts:
            note(f"{c.get('rel')}: part {k} ({r.host}) {c.get('detail')}")
        for rel, f in r.files.items():
            if rel not in merged:
                merged[rel] = (k, f)
                continue
            k0, f0 = merged[rel]
            if (f0.size, f0.digests) != (f.size, f.digests):
                note(f"{rel}: part {k0} ({recs[k0].host}) and part {k} ({r.host}) hold different "
                                f"bytes ({f0.size} vs {f.size} bytes, xxh3 {f0.digests[0][:12]} vs "
                                f"{f.digests[0][:12]})")
    if problems:
        more = f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""
        raise PartRefused(f"{where}: conflicting copies, nothing committed: " + "; ".join(problems[:4]) + more)
    return {rel: f for rel, (_, f) in merged.items()}
