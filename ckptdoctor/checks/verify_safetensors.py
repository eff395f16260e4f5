"""Hugging Face safetensors files and their index, from headers only (any checkpoint layout)."""
from __future__ import annotations

from ..engine.finding import Hit
from ..engine.registry import check
from ..layouts import safetensors as stf

MAX_INDEX_BYTES = 256 << 20


def headers(ck, eng) -> dict[str, stf.Header | str]:
    """name -> Header, or the one-line reason the loader would reject the file (read once per view)."""
    if "safetensors" in ck.results:
        return ck.results["safetensors"]
    out: dict[str, stf.Header | str] = {}
    for name, e in sorted(ck.files.items()):
        if not name.endswith(".safetensors"):
            continue
        rel = ck.relpath(name)
        try:
            out[name] = stf.read_header(lambda off, n, rel=rel: ck.storage.read_range(rel, off, n), e.size)
        except stf.HeaderError as exc:
            out[name] = str(exc)
        except OSError as exc:
            out[name] = f"cannot read: {exc.strerror or exc}"
    ck.results["safetensors"] = out
    return out


@check("CKD120", "checkpoint")
def safetensors_header_invalid(ck, eng):
    for name, h in headers(ck, eng).items():
        if isinstance(h, str):
            yield Hit(ck.path(name), f"{name}: {h}", details={"file": name},
                      hint="the safetensors loader rejects this file; re-copy or re-save it")


@check("CKD121", "checkpoint")
def safetensors_index_mismatch(ck, eng):
    idx_names = [n for n in ck.files if n.endswith(stf.INDEX_SUFFIX)]
    if not idx_names:
        return
    hs = headers(ck, eng)
    for idx in idx_names:
        try:
            wm, total = stf.parse_index(ck.storage.read(ck.relpath(idx), MAX_INDEX_BYTES))
        except (stf.HeaderError, ValueError) as exc:
            yield Hit(ck.path(idx), f"{idx}: {exc}", details={"index": idx})
            continue
        shards = sorted(set(wm.values()))
        for s in shards:
            if s not in ck.files:
                n = sum(1 for v in wm.values() if v == s)
                yield Hit(ck.path(s), f"shard {s} named by {idx} is missing ({n} tensors)",
                          details={"index": idx, "shard": s, "tensors": n},
                          hint="copy the missing shard; a loader fails on the first tensor it maps there")
        located: dict[str, list[str]] = {}
        for s, h in hs.items():
            if isinstance(h, stf.Header):
                for t in h.tensors:
                    located.setdefault(t, []).append(s)
        for s in shards:
            h = hs.get(s)
            if not isinstance(h, stf.Header):
                continue
            absent = [t for t, f in wm.items() if f == s and t not in h.tensors]
            if absent:
                yield Hit(ck.path(s), f"{len(absent)} tensor(s) mapped to {s} by {idx} are not in its header "
                          f"(e.g. {absent[0]})", details={"shard": s, "tensors": absent[:20]})
        twice = {t: fs for t, fs in located.items() if len(fs) > 1}
        if twice:
            t, fs = next(iter(sorted(twice.items())))
            yield Hit(ck.path(idx), f"{len(twice)} tensor(s) appear in more than one shard (e.g. {t} in "
                      f"{', '.join(fs)})", details={"tensors": dict(list(sorted(twice.items()))[:20])})
        misplaced = [(t, fs[0]) for t, fs in located.items() if len(fs) == 1 and t in wm and wm[t] != fs[0]]
        if misplaced:
            t, f = misplaced[0]
            yield Hit(ck.path(idx), f"{len(misplaced)} tensor(s) live in a different shard than the index says "
                      f"(e.g. {t} is in {f}, index says {wm[t]})", details={"tensor": t, "in": f, "index": wm[t]})
        stray = sorted(s for s in hs if s not in shards)
        for s in stray:
            yield Hit(ck.path(s), f"{s} is not referenced by {idx}", severity="warning",
                      details={"shard": s}, hint="a leftover from another save? loaders ignore it")
        if total is not None and all(isinstance(hs.get(s), stf.Header) for s in shards):
            have = sum(hs[s].data_bytes for s in shards)
            if have != total:
                yield Hit(ck.path(idx), f"metadata.total_size is {total} but the shards hold {have} tensor "
                          f"bytes", severity="warning", details={"total_size": total, "actual": have},
                          hint="can legitimately differ with tied weights; otherwise a shard is from another save")
