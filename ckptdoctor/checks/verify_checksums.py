"""Content verification against the checkpoint manifest (and Megatron's integrity.json).

Enabled by `verify --checksums`.  Fail closed: no manifest is an error, not a pass.  Missing,
extra and changed files are separate findings.  `--slice K/N` hashes a deterministic 1/N of the
work (files and 64 MiB ranges of large files) so N nodes can share a large checkpoint.
"""
from __future__ import annotations

from ..values import value, field

from ..engine.finding import Hit
from ..engine.registry import check
from ..io.fs import TreeLimit, walk_files
from ..layouts.spec import match_any
from ..layouts import manifest as mf


@value
class ContentResult:
    sources: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)      # (source, message)
    changed: list[dict] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)       # (rel, source)
    extra: list[tuple[str, str]] = field(default_factory=list)
    units: int = 0
    bytes: int = 0
    walk_error: str | None = None      # the tree could not be walked whole (reported as CKD901)


def content(ck, eng) -> ContentResult | None:
    if not eng.opt("checksums"):
        return None
    if "content" in ck.results:
        return ck.results["content"]
    from ..io import hashing  # here, not at import: only --checksums hashes
    res = ck.results["content"] = ContentResult()
    try:
        on_disk = walk_files(ck.storage, ck.rel, None if ck.only is not None else list(ck.entries.values()))
    except TreeLimit as exc:  # fail closed: what was not walked is not verified
        eng.emit("CKD901", Hit(ck.display, f"--checksums: {exc}", details={"limit": str(exc)}))
        res.walk_error = str(exc)
        return res
    k, n = eng.opt("slice", (0, 1))
    work: list[tuple[hashing.Unit, mf.Expected, str]] = []
    listed_anywhere: set[str] = set()
    for source in (mf.NAME, mf.INTEGRITY):
        if source not in on_disk:
            continue
        res.sources.append(source)
        try:
            expected = mf.parse(ck.storage.read(ck.relpath(source), mf.MAX_MANIFEST_BYTES), source)
        except (mf.ManifestError, ValueError) as exc:
            res.problems.append((source, str(exc)))
            continue
        except OSError as exc:
            res.problems.append((source, f"cannot read: {exc.strerror or exc}"))
            continue
        listed_anywhere |= set(expected)
        for rel, exp in sorted(expected.items()):
            if rel not in on_disk:
                res.missing.append((rel, source))
                continue
            size = on_disk[rel]
            if exp.size is not None and size != exp.size:
                res.changed.append({"file": rel, "source": source, "expected_bytes": exp.size,
                                    "actual_bytes": size, "why": "size differs"})
                continue
            us = hashing.units_for(rel, size, exp.algorithm, exp.chunk_bytes or hashing.CHUNK_BYTES)
            work += [(u, exp, source) for u in us]
    if res.sources and not res.problems:  # a file no manifest lists is not verified (fail closed)
        for rel in sorted(set(on_disk) - listed_anywhere - {mf.NAME, mf.INTEGRITY}):
            res.extra.append((rel, "/".join(res.sources)))
    mine = set(hashing.partition([w[0] for w in work], k, n))
    work = [w for w in work if w[0] in mine]
    res.units = len(work)
    res.bytes = sum(w[0].length for w in work)
    if work:
        prog = eng.progress(res.bytes, f"hashing {ck.name}")
        st = ck.storage.sub(ck.rel) if ck.rel else ck.storage  # units are relative to the checkpoint
        unreadable: dict[hashing.Unit, OSError] = {}
        digests = hashing.hash_units(st, [w[0] for w in work], eng.opt("workers"), prog,
                                     on_error=unreadable.__setitem__)
        prog.close()
        for u, exc in sorted(unreadable.items(), key=lambda t: (t[0].rel, t[0].index)):  # one per file (deduped)
            eng.emit("CKD901", Hit(ck.path(u.rel), f"--checksums: cannot read {u.rel}: {exc.strerror or exc}",
                                   details={"file": u.rel, "errno": exc.errno}))
        work = [w for w in work if w[0] not in unreadable]
        for u, exp, source in work:
            got, nread = digests[u]
            want = exp.digests[u.index]
            if got != want or nread != u.length:
                res.changed.append({"file": u.rel, "source": source, "algorithm": u.algorithm,
                                    "range": [u.start, u.start + u.length], "expected": want,
                                    "actual": got, "why": "content differs" if nread == u.length
                                    else "file changed while reading"})
    return res


@check("CKD150", "checkpoint", option="checksums")
def manifest_missing(ck, eng):
    res = content(ck, eng)
    if res is not None and not res.sources and res.walk_error is None:
        yield Hit(ck.display, f"--checksums: no {mf.NAME} (or {mf.INTEGRITY}) in this checkpoint, so its "
                              f"content cannot be verified", details={"expected": [mf.NAME, mf.INTEGRITY]},
                  hint="write one from a known-good copy with `ckptdoctor manifest PATH` (or publish with "
                       "`ckptdoctor publish`)")


@check("CKD151", "checkpoint", option="checksums")
def checksum_mismatch(ck, eng):
    res = content(ck, eng)
    for d in (res.changed if res else []):
        where = f" bytes {d['range'][0]}-{d['range'][1]}" if "range" in d else ""
        yield Hit(ck.path(d["file"]), f"{d['file']}: {d['why']}{where} (vs {d['source']})", details=d,
                  hint="the file is not what was saved (bit flip, partial copy, or a file from another "
                       "run); re-copy it from the source")


@check("CKD152", "checkpoint", option="checksums")
def listed_file_missing(ck, eng):
    res = content(ck, eng)
    for rel, source in (res.missing if res else []):
        yield Hit(ck.path(rel), f"{rel} is listed in {source} but does not exist",
                  details={"file": rel, "source": source})


DATA_SUFFIXES = (".distcp", ".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".metadata", ".npz", ".msgpack")


def _is_data(ck, rel: str) -> bool:
    """A file the checkpoint's family loads (its shards, markers, archives, per-rank files), as
    opposed to a stray README or log."""
    lay = ck.layout
    base = rel.rsplit("/", 1)[-1]
    pats = lay.detect_files + lay.optional_archives + lay.required + tuple(m for g in lay.markers for m in g)
    if lay.reads is not None:
        pats += lay.reads.global_files + lay.reads.optional_global
        if lay.reads.rank_of(rel) is not None:
            return True
    return base.endswith(DATA_SUFFIXES) or match_any(base, pats)


@check("CKD153", "checkpoint", option="checksums")
def unlisted_file(ck, eng):
    res = content(ck, eng)
    for rel, source in (res.extra if res else []):
        data = _is_data(ck, rel)
        yield Hit(ck.path(rel), f"{rel} is not listed in {source}" + (": its content is not verified" if data else ""),
                  severity="error" if data else None, details={"file": rel, "source": source, "data_file": data},
                  hint="added after the manifest was written; remove it or rewrite the manifest if intended")


@check("CKD154", "checkpoint", option="checksums")
def manifest_unreadable(ck, eng):
    res = content(ck, eng)
    for source, msg in (res.problems if res else []):
        yield Hit(ck.path(source), f"{source}: {msg}", details={"file": source},
                  hint="the manifest itself is corrupt; content cannot be verified against it")
