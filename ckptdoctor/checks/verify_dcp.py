"""PyTorch DCP checks: metadata, shard set, sizes, slices, marker order, coverage, experts.

All read only `.metadata` and a few small ranges per storage record (its zip framing): no tensor bytes.
"""
from __future__ import annotations

import re
from collections import defaultdict

from ..engine.finding import Hit
from ..engine.registry import check
from ..layouts import coverage, ptzip
from ..io.fs import NotRegularFile, ShardReaders, map_io, open_regular
from ..layouts.dcp import SHARD_RE

DEFAULT_MTIME_TOLERANCE = 2.0
EXPERT_INDEX_RE = re.compile(r"(?:^|\.)experts\.(\d+)\.")
EXPERT_KEY_RE = re.compile(r"(?:^|\.)experts(?:\.|$)")
EXPERT_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _md(ck):
    if ck.layout.reader != "dcp":
        return None
    return ck.dcp.metadata


def _mdpath(ck) -> str:
    names = ck.metadata_files()
    return ck.path(names[0] if names else ".metadata")


def _ends(md) -> dict[str, int]:
    ends: dict[str, int] = defaultdict(int)
    for s in md.storage:
        ends[s.relative_path] = max(ends[s.relative_path], s.file_offset + s.length)
    return ends


@check("CKD110", "checkpoint")
def metadata_unreadable(ck, eng):
    if ck.layout.reader != "dcp":
        return
    for p in ck.dcp.problems:
        yield Hit(ck.path(p.file), f"cannot read DCP metadata: {p.message}",
                  details={"file": p.file, "refused_global": p.refused_global},
                  hint="a hostile or corrupt .metadata; nothing from it was executed" if p.refused_global
                  else "the metadata file is truncated or corrupt; the checkpoint cannot be loaded")


@check("CKD103", "checkpoint")
def shard_missing(ck, eng):
    md = _md(ck)
    if not md:
        return
    files = ck.files
    refs: dict[str, int] = defaultdict(int)
    for s in md.storage:
        refs[s.relative_path] += 1
    for rel, n in sorted(refs.items()):
        if rel not in files:
            yield Hit(ck.path(rel), f"shard {rel} is referenced by {n} metadata record(s) but does not exist",
                      details={"file": rel, "records": n}, hint="copy the missing shard or resume from an "
                                                                "older checkpoint")


@check("CKD104", "checkpoint")
def shard_truncated(ck, eng):
    md = _md(ck)
    if not md:
        return
    files = ck.files
    for rel, end in sorted(_ends(md).items()):
        e = files.get(rel)
        if e is not None and e.size < end:
            yield Hit(ck.path(rel), f"shard {rel} is {e.size} bytes but its metadata needs at least {end}",
                      details={"file": rel, "expected_min_bytes": end, "actual_bytes": e.size,
                               "missing_bytes": end - e.size},
                      hint="the shard was truncated (interrupted copy or write); re-copy it")


def storage_by_file(ck) -> dict[str, list]:
    """The checkpoint's storage records by shard, built once for CKD105 and --deep (--deep picking
    each shard's records out of the whole list was 512 x 1M steps at 1M records: 275 s)."""
    idx = ck.results.get("dcp_by_file")
    if idx is None:
        idx = ck.results["dcp_by_file"] = {}
        for s in ck.dcp.metadata.storage:
            idx.setdefault(s.relative_path, []).append(s)
    return idx


@check("CKD105", "checkpoint")
def slice_corrupt(ck, eng):
    """Each storage record must be one whole torch.save zip archive (local storage only)."""
    md = _md(ck)
    if not md or not ck.storage.local or not ck.read_data:
        return
    files = ck.files
    todo = [(rel, recs) for rel, recs in sorted(storage_by_file(ck).items()) if rel in files]
    readers = ShardReaders()
    # Each shard's open, reads and judgement are one job: on Lustre or NFS the open is a metadata
    # round trip and each read of a cold shard a round trip to a data server, so they go concurrent
    # there (map_io); a read error is carried back and raised here, as when this loop read serially
    # (benchmarks/latency/delayed.py, 2 ms per metadata call and per read, the gate of 3 x 4,096
    # shards: 10.4 s with the opens concurrent and the reads one after another here, 1.9 s now).
    for (rel, _), res in zip(todo, map_io(lambda job: _shard_slices(ck, readers, files[job[0]].size, *job), todo)):
        if isinstance(res, NotRegularFile):
            eng.emit("CKD901", Hit(ck.path(rel), f"{rel} is {res.strerror}", details={"file": rel},
                                   hint="a shard must be a regular file; something replaced it"))
            continue
        if isinstance(res, OSError):  # listed a moment ago, gone or unreadable now
            eng.emit("CKD901", Hit(ck.path(rel), f"cannot read {rel}: {res.strerror or res} (it was listed "
                                   f"a moment earlier: changed while being verified?)",
                                   details={"file": rel, "errno": res.errno},
                                   hint="something is writing or deleting this checkpoint; verify it again "
                                        "once it is quiet"))
            continue
        if isinstance(res, BaseException):
            raise res
        if isinstance(res, _ReadFailed):
            raise res.exc
        bad, nbad = res
        for s, why in bad:
            yield Hit(ck.path(rel), f"record {s.fqn!r} at {s.file_offset}+{s.length}: {why}",
                      details={"file": rel, "fqn": s.fqn, "offset": s.file_offset, "length": s.length},
                      hint="the shard's bytes do not match its metadata (overwritten or mixed generations)")
        if nbad > len(bad):
            yield Hit(ck.path(rel), f"{nbad - len(bad)} more corrupt records in {rel}",
                      details={"file": rel, "more": nbad - len(bad)})


class _ReadFailed:
    """A shard that opened but whose bytes could not be read: raised by the check, not CKD901."""
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def _shard_slices(ck, readers, size: int, rel: str, recs: list):
    """([(record, why)] for the first five records of one shard whose bytes are not one whole
    torch.save archive, how many there are): map_io holds a batch of these at once."""
    import os
    fd = open_regular(ck.storage.abspath(ck.relpath(rel)))   # its errors: CKD901, above
    try:
        shard = readers.mine()
        bad, nbad = [], 0
        try:
            shard.open(fd, size, len(recs))
            read = shard.read
            for s in recs:
                if s.file_offset + s.length > size:
                    continue  # CKD104 reports it
                if s.transforms:  # a storage extension wrote it: check the transform's own framing
                    why = ptzip.transformed_problem(s.transforms, read(s.file_offset, 4), s.length)
                else:
                    why = ptzip.slice_problem(read, s.file_offset, s.length)
                if why:
                    nbad += 1
                    if nbad <= 5:
                        bad.append((s, why))
        except Exception as exc:
            return _ReadFailed(exc)
        return bad, nbad
    finally:
        os.close(fd)


@check("CKD133", "checkpoint")
def storage_record_missing(ck, eng):
    """Every chunk of every tensor, and every bytes item, must have a storage record: dcp.load looks
    each one up by MetadataIndex(fqn, offsets) and raises KeyError where there is none (torch 2.13)."""
    md = _md(ck)
    if not md:
        return
    have = {(s.fqn, s.offset) for s in md.storage}
    missing = []
    for fqn, t in md.tensors.items():
        missing += [(fqn, o) for o, _z in t.chunks if (fqn, tuple(o)) not in have]
    missing += [(fqn, None) for fqn in sorted(md.byte_keys) if (fqn, None) not in have]
    for fqn, o in missing[:5]:
        what = f"tensor {fqn!r} chunk at offsets {list(o)}" if o is not None else f"item {fqn!r}"
        yield Hit(_mdpath(ck), f"{what} has no storage record: dcp.load raises KeyError "
                               f"MetadataIndex(fqn={fqn!r}, ...)",
                  details={"fqn": fqn, "offsets": None if o is None else list(o), "missing_records": len(missing)},
                  hint="the .metadata is inconsistent with itself (hand-edited, merged, or a custom "
                       "planner's bug); re-save, or resume from an older checkpoint")
    if len(missing) > 5:
        yield Hit(_mdpath(ck), f"{len(missing) - 5} more items without a storage record",
                  details={"more": len(missing) - 5})


@check("CKD106", "checkpoint")
def stray_shard(ck, eng):
    md = _md(ck)
    if not md:
        return
    refs = {s.relative_path for s in md.storage}
    for name, e in sorted(ck.files.items()):
        if name.endswith(".distcp") and name not in refs and e.size > 0:
            yield Hit(ck.path(name), f"{name} ({e.size} bytes) is not referenced by the metadata",
                      details={"file": name, "bytes": e.size},
                      hint="a leftover of another save into the same directory; the loader ignores it, "
                           "but it signals mixed generations")


MIN_COPY_RATE = 1 << 20  # bytes/s: slower than any copy tool on any storage a training run uses
COPY_SLACK_S = 5.0        # directory walks, metadata round trips, a paused copy
MIN_COPY_FILE_RATE = 20   # files/s: a copy pays a round trip per file (an S3 PUT is 20-100 ms); seen:
                          # s3fs put of 3 x 1,024 small shards to a 20 ms endpoint wrote .metadata
                          # first and the last shard 10 s later, 1.4 MB after it (issue 42's harness)


@check("CKD107", "checkpoint")
def marker_not_last(ck, eng):
    """A shard clearly newer than the marker means the directory was rewritten after commit."""
    if ck.layout.reader != "dcp":
        return
    tol = float(eng.opt("mtime_tolerance", DEFAULT_MTIME_TOLERANCE))
    marker = next((ck.files[n] for n in ck.metadata_files() if n in ck.files), None)
    if marker is None or marker.mtime is None:
        return
    md = _md(ck)
    refs = {s.relative_path for s in md.storage} if md else None  # what dcp.load reads (CKD106: strays)
    late = [(n, e) for n, e in ck.files.items()
            if SHARD_RE.match(n) and (refs is None or n in refs) and e.mtime is not None
            and e.mtime - marker.mtime > tol]
    if late:
        late.sort(key=lambda t: -t[1].mtime)
        n, e = late[0]
        gap = e.mtime - marker.mtime
        # Could a copy that wrote the marker first explain the gap?  Everything written after the
        # marker and up to this shard, at the slowest plausible copy rate, plus slack.
        written = [f for f in ck.files.values() if f.mtime is not None and marker.mtime < f.mtime <= e.mtime]
        after = sum(f.size for f in written)
        explainable = after / MIN_COPY_RATE + len(written) / MIN_COPY_FILE_RATE + COPY_SLACK_S
        copy = gap <= explainable
        yield Hit(ck.path(n), f"{len(late)} shard(s) modified after the commit marker {marker.name} "
                              f"(newest {n}, {gap:.1f} s later" + (
                                  ")" if copy else f"; the {len(written)} files ({after} bytes) written after the "
                                                   f"marker would copy in {explainable:.0f} s even at "
                                                   f"{MIN_COPY_RATE >> 20} MiB/s and {MIN_COPY_FILE_RATE} files/s: "
                                                   f"a re-save into the same directory, not a copy)"),
                  severity="warning" if copy else "error",
                  details={"marker": marker.name, "files": sorted(x for x, _ in late)[:20],
                           "max_seconds_after_marker": round(gap, 3), "tolerance_seconds": tol,
                           "bytes_after_marker": after, "files_after_marker": len(written),
                           "copy_explains_up_to_seconds": round(explainable, 1)},
                  hint="the directory was written again after commit (mixed generations); if it was "
                       "copied without preserving mtimes, copy with `cp -a`/`rsync -t` or raise "
                       "--mtime-tolerance")


@check("CKD108", "checkpoint")
def chunk_coverage(ck, eng):
    md = _md(ck)
    if not md:
        return
    for fqn, t in md.tensors.items():
        for msg, det in coverage.problems(t.size, t.chunks):
            yield Hit(_mdpath(ck), f"tensor {fqn!r}: {msg}", details={"fqn": fqn, **det},
                      hint="some ranks' pieces of this tensor were never saved (or saved twice); "
                           "loading it would leave uninitialised or ambiguous values")


def _expected_experts(ck, eng) -> tuple[int | None, str | None]:
    n = eng.opt("num_experts")
    if n:
        return int(n), "--num-experts"
    import json
    st = ck.storage
    rel = ck.rel
    for _ in range(3):  # the checkpoint dir, its run root, and one more parent
        cfg = st.join(rel, "config.json")
        try:
            data = st.read(cfg, 1 << 20)
            doc = json.loads(data)
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict):
            for src in (doc, doc.get("text_config") or {}):
                for key in EXPERT_CONFIG_KEYS:
                    v = src.get(key) if isinstance(src, dict) else None
                    if isinstance(v, int) and v > 0:
                        return v, f"{st.show(cfg)}:{key}"
        if not rel:
            break
        rel = rel.rsplit("/", 1)[0] if "/" in rel else ""
    return None, None


@check("CKD109", "checkpoint")
def expert_collision(ck, eng):
    """Expert weights that cover fewer experts than the model has: EP groups collided in dedup."""
    md = _md(ck)
    if not md:
        return
    expert_keys = [f for f in md.tensors if EXPERT_KEY_RE.search(f)]
    if not expert_keys:
        return
    want, source = _expected_experts(ck, eng)
    writers: dict[str, set[int]] = defaultdict(set)
    for s in md.storage:
        m = SHARD_RE.match(s.relative_path)
        if m and s.fqn in md.tensors and EXPERT_KEY_RE.search(s.fqn):
            writers[s.fqn].add(int(m["rank"]))
    if want is None:
        return
    # 1) per-expert keys: experts.{i}. -- count distinct indices per key template
    indexed: dict[str, set[int]] = defaultdict(set)
    for f in expert_keys:
        m = EXPERT_INDEX_RE.search(f)
        if m:
            indexed[EXPERT_INDEX_RE.sub(".experts.{i}.", f, count=1)].add(int(m.group(1)))
    for tmpl, idx in sorted(indexed.items()):
        if len(idx) < want:
            missing = sorted(set(range(want)) - idx)
            yield Hit(_mdpath(ck), f"{tmpl!r}: {len(idx)} of {want} experts saved "
                                            f"(missing {missing[:8]}{'...' if len(missing) > 8 else ''})",
                      details={"key": tmpl, "saved": sorted(idx)[:64], "expected_experts": want,
                               "expected_from": source},
                      hint="expert-parallel ranks collided in DCP's dedup; resume would load the wrong "
                           "experts. Re-save with expert keys unique per EP rank.")
    # 2) stacked expert tensors: no dimension equals the expert count
    for f in expert_keys:
        if EXPERT_INDEX_RE.search(f):
            continue
        t = md.tensors[f]
        if len(t.size) >= 2 and want not in t.size:
            cand = [d for d in t.size if d and want % d == 0 and d < want]
            if cand:
                yield Hit(_mdpath(ck),
                          f"{f!r} has shape {list(t.size)}: no dimension holds all {want} experts "
                          f"(looks like one EP group's {cand[0]} local experts)",
                          details={"fqn": f, "global_shape": list(t.size), "expected_experts": want,
                                   "expected_from": source, "writer_ranks": sorted(writers.get(f, ()))},
                          hint="only one expert-parallel group's experts were saved (DCP dedup kept one "
                               "copy); use the save-time guard ckptdoctor.guards.check_unique_shards")


def _pickled(name: str) -> str:
    """'...metadata.StorageMeta' -> 'StorageMeta'; '...metadata.TensorProperties.state[6]' ->
    'TensorProperties with 6 state fields'."""
    import re
    m = re.search(r"\.([A-Za-z_]\w*)\.state\[(\d+)\]$", name)
    return f"{m.group(1)} with {m.group(2)} state fields" if m else name.rsplit(".", 1)[-1]


@check("CKD134", "checkpoint")
def torch_cannot_load(ck, eng):
    """The torch that will load it (--loader-torch, else the one installed here) must have every
    global the `.metadata` pickles, and must not be in a range that fails on what the checkpoint
    holds (rules/torch-loaders.yaml: measured with the real wheels)."""
    md = _md(ck)
    if not md:
        return
    from ..layouts import torchver
    given = eng.opt("loader_torch")
    loader = given or torchver.installed()
    src = "--loader-torch" if given else "installed here"
    since, why = torchver.needed(md.globals) if md.globals else (None, [])
    gaps = torchver.gaps(md, lambda rel, off, n: ck.storage.read_range(ck.relpath(rel), off, n)) \
        if ck.storage.local else []
    ck.results["torch_gaps"] = gaps   # the verify row reports them as a fact
    if loader is None:
        return
    if since is not None and torchver.vtuple(loader) < torchver.vtuple(since):
        table = torchver.table()
        said = [_pickled(n) for n in why]
        raises = sorted({table[n].get("raises", "AttributeError") for n in why})
        yield Hit(_mdpath(ck), f"torch {loader} ({src}) cannot load this checkpoint: its .metadata pickles "
                               f"{', '.join(said)}, which torch reads only since {since} "
                               f"(dcp.load raises {' or '.join(raises)} inside a CheckpointException)",
                  details={"loader_torch": loader, "source": src, "needs": since, "globals": why},
                  hint=f"load it with torch >= {since} (the image that wrote it), or pass --loader-torch with the "
                       f"job's torch version if it is not the one installed here")
    for g in gaps:
        if torchver.in_range(loader, g):
            keys = ", ".join(repr(k) for k in g["keys"][:4]) + (" ..." if len(g["keys"]) > 4 else "")
            yield Hit(_mdpath(ck), f"torch {loader} ({src}) cannot load this checkpoint into a state dict that "
                                   f"holds the same values: it stores the non-tensor dict(s) {keys} whole (written "
                                   f"before torch 2.4), and torch {g['from']} up to {g['until']} look for their "
                                   f"flattened keys (dcp.load raises {g['raises']} inside a CheckpointException)",
                      details={"loader_torch": loader, "source": src, "gap": [g["from"], g["until"]],
                               "keys": g["keys"]},
                      hint=f"load it with torch < {g['from']} or >= {g['until']}, or pass --loader-torch with the "
                           f"job's torch version if it is not the one installed here")
