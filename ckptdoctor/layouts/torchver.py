"""Which torch can load a DCP checkpoint, from the globals its `.metadata` pickles
(rules/torch-loaders.yaml, measured with the real wheels: tests/conformance/gen_torch_versions.py)."""
from __future__ import annotations

import functools
import re


def vtuple(v: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); a version that is not one is a usage error of the caller."""
    m = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", v or "")
    if not m:
        raise ValueError(f"{v!r} is not a torch version (e.g. 2.3.1)")
    return tuple(int(x or 0) for x in m.groups())


@functools.lru_cache(maxsize=1)
def _doc() -> dict:
    from ..engine.catalog import data_dir, load_yaml
    return load_yaml(data_dir() / "torch-loaders.yaml")


def table() -> dict[str, dict]:
    return {e["global"]: e for e in _doc()["globals"]}


STORAGE_META = "torch.distributed.checkpoint.metadata.StorageMeta"
DICT_PICKLE = (b"\x80\x02}", b"\x80\x02(")   # a pickled dict: PROTO 2, EMPTY_DICT (or MARK, then items)


def gaps(md, read) -> list[dict]:
    """Loader ranges that cannot load this checkpoint for what it holds (rules/torch-loaders.yaml
    `gaps`), each with the keys that decide it.  `read(rel, offset, n)` reads n bytes of a storage
    file; only a pre-2.4 writer's top-level bytes items are read, 64 bytes each."""
    out = []
    for e in _doc().get("gaps") or ():
        if e["kind"] == "unflattened-non-tensor-dict":
            keys = _nested_bytes(md, read)
            if keys:
                out.append(dict(e, keys=keys))
    return out


def _nested_bytes(md, read, limit: int = 64) -> list[str]:
    """Top-level bytes items that hold a whole dict: a writer before 2.4 (no StorageMeta) that did not
    flatten a dict of non-tensor values.  Each item is a torch.save zip; its first entry's data is
    the pickle, which is only looked at (two bytes), never loaded."""
    import struct
    if any(f"{m}.{n}" == STORAGE_META for m, n in md.globals):
        return []
    top = {k for k in md.byte_keys if "." not in k}
    found = []
    for s in md.storage:
        if s.fqn not in top or len(found) >= limit or s.length < 34:
            continue
        try:
            head = read(s.relative_path, s.file_offset, min(s.length, 512))
            sig, *_, nlen, xlen = struct.unpack_from("<IHHHHHIIIHH", head)
            data = head[30 + nlen + xlen:]
        except (OSError, ValueError, struct.error):
            continue
        if sig == 0x04034B50 and data.startswith(DICT_PICKLE):
            found.append(s.fqn)
    return sorted(found)


def in_range(v: str, gap: dict) -> bool:
    return vtuple(gap["from"]) <= vtuple(v) < vtuple(gap["until"])


def needed(globals_seen) -> tuple[str | None, list[str]]:
    """(the oldest torch that can unpickle it or None when any can, the globals that decide it)."""
    t = table()
    hits = [t[f"{m}.{n}"] for m, n in globals_seen if f"{m}.{n}" in t]
    if not hits:
        return None, []
    top = max(hits, key=lambda h: vtuple(h["since"]))["since"]
    return top, sorted(h["global"] for h in hits if vtuple(h["since"]) == vtuple(top))


@functools.lru_cache(maxsize=1)
def installed() -> str | None:
    """The torch installed beside ckptdoctor, from its `torch/version.py` (found, never imported:
    importing torch takes a second; importlib.metadata alone took 36 ms of a 270 ms verify)."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        locs = list(spec.submodule_search_locations or []) if spec else []
        if not locs:
            return None
        with open(f"{locs[0]}/version.py", "rb") as fh:
            m = re.search(rb"""__version__\s*=\s*['"]([^'"]+)['"]""", fh.read(64 << 10))
        return m.group(1).decode() if m else None
    except (OSError, ImportError, ValueError):   # no torch, or an unreadable one: no default loader
        return None
