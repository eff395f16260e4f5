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
def table() -> dict[str, dict]:
    from ..engine.catalog import data_dir, load_yaml
    return {e["global"]: e for e in load_yaml(data_dir() / "torch-loaders.yaml")["globals"]}


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
