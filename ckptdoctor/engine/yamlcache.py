"""A compiled cache of the shipped YAML (rules, layouts, profiles), so a command starts without
importing and running the YAML parser (issue 20: start-up).  The YAML stays the source of truth:
the cache is keyed by a content hash of every shipped YAML file (names and bytes), rebuilt on the
first run after any change, and skipped whenever it cannot be written or read.  Only documents that
survive a JSON round trip unchanged are cached (a YAML-only type would not)."""
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


def _sources(root: Path) -> list[tuple[str, bytes]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith((".yaml", ".yml")):
                p = os.path.join(dirpath, f)
                with open(p, "rb") as fh:
                    out.append((os.path.relpath(p, root), fh.read(1 << 20)))
    return out


def docs(root: Path) -> dict[str, object]:
    """relative path -> parsed document, for every shipped YAML file (from the cache when valid)."""
    key = str(root)
    if key in _DOCS:
        return _DOCS[key]
    import xxhash
    srcs = _sources(root)
    h = xxhash.xxh3_128()
    for rel, data in srcs:
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    cache = _cache_dir() / f"yaml-{h.hexdigest()}.json"
    try:
        with open(cache, "rb") as fh:
            got = json.loads(fh.read())
        if isinstance(got, dict) and set(got) == {r for r, _ in srcs}:
            _DOCS[key] = got
            return got
    except (OSError, ValueError, RecursionError):
        pass  # absent, unreadable or damaged: parse the YAML and write it again
    from .catalog import parse_yaml as parse
    parsed = {rel: parse(data) for rel, data in srcs}
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
