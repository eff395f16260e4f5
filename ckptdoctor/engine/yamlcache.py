"""A compiled cache of the shipped YAML (rules, layouts, profiles), so a command starts without
importing and running the YAML parser (issue 20: start-up).  The YAML stays the source of truth:
the cache is keyed by every shipped YAML file's name, size, inode and change time (ctime: every
write moves it and no tool can set it back, so an edit, a checkout or a reinstall is seen at once),
rebuilt on the first run after any change, and skipped whenever it cannot be written or read.
Keying by stat, not by the bytes, is what makes the cache pay: reading and hashing the ~110 files
took 12 ms of a ~60 ms start, the stats take under 1 ms.  Only documents that survive a JSON round
trip unchanged are cached (a YAML-only type would not)."""
from __future__ import annotations

import json
import os
from pathlib import Path

_DOCS: dict[str, dict[str, object]] = {}   # root -> its documents, once per process
MISSING = object()


def _cache_dir() -> Path:
    base = os.environ.get("CKPTDOCTOR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ckptdoctor")
    return Path(base)


def _signature(root: Path) -> list[tuple[str, int, int, int]]:
    """(relative path, size, inode, ctime_ns) of every YAML file under root, sorted."""
    out = []
    stack = [("", str(root))]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            for e in it:
                r = f"{rel}{e.name}"
                if e.is_dir(follow_symlinks=False):
                    stack.append((r + "/", e.path))
                elif e.name.endswith((".yaml", ".yml")):
                    st = e.stat()
                    out.append((r, st.st_size, st.st_ino, st.st_ctime_ns))
    out.sort()
    return out


def _read(root: Path, rel: str) -> bytes:
    with open(os.path.join(root, rel), "rb") as fh:
        return fh.read(1 << 20)


def docs(root: Path) -> dict[str, object]:
    """relative path -> parsed document, for every shipped YAML file (from the cache when valid)."""
    key = str(root)
    if key in _DOCS:
        return _DOCS[key]
    import xxhash
    sig = _signature(root)
    h = xxhash.xxh3_128(repr((str(root), sig)).encode())
    cache = _cache_dir() / f"yaml-{h.hexdigest()}.json"
    try:
        with open(cache, "rb") as fh:
            got = json.loads(fh.read())
        if isinstance(got, dict) and set(got) == {s[0] for s in sig}:
            _DOCS[key] = got
            return got
    except (OSError, ValueError, RecursionError):
        pass  # absent, unreadable or damaged: parse the YAML and write it again
    from .catalog import parse_yaml as parse
    parsed = {s[0]: parse(_read(root, s[0])) for s in sig}
    _DOCS[key] = parsed
    try:
        text = json.dumps(parsed)
        if json.loads(text) == parsed:  # only what JSON carries exactly
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, cache)
    except (OSError, TypeError, ValueError):
        pass  # a read-only home: parse every time, as before
    return parsed
