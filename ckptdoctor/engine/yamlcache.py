"""The shipped YAML (rules, layouts, profiles) compiled to JSON at build time, so a command starts
without importing and running the YAML parser (issue 20: start-up; issue 38: no runtime caches).

`scripts/gen_docs.py` writes `ckptdoctor/_compiled_rules.json` from rules/: every document, with each
file's size.  At run time one walk of the rules directory (a stat per file, under 1 ms) compares the
sizes: when they match, the compiled documents are used; when not (a YAML file edited in a checkout
without regenerating, which tests/test_docs.py also fails on), the YAML is parsed, as without an
artefact.  Nothing is written at run time, anywhere: the user's home is never touched (a cache keyed
by stat there went stale and grew by a file per checkout; a Prolog's home may be read-only).

An installed wheel (rules shipped as `ckptdoctor/_rules`) skips the walk: its artefact was built
from those very files in the same build, and a site install often lives on a shared filesystem
where each of the ~100 stats is a metadata round trip (0.2 s of every start-up at 2 ms per call,
measured with benchmarks/latency/delayed.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

_DOCS: dict[str, dict[str, object]] = {}   # root -> its documents, once per process
MISSING = object()


ARTEFACT = Path(__file__).resolve().parent.parent / "_compiled_rules.json"


def _signature(root: Path) -> list[tuple[str, int]]:
    """(relative path, size) of every YAML file under root, sorted."""
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
                    out.append((r, e.stat().st_size))
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
    installed = root.name == "_rules"   # a wheel's rules, built together with its artefact
    sig = None if installed else _signature(root)
    try:
        with open(ARTEFACT, "rb") as fh:
            got = json.loads(fh.read())
        if isinstance(got, dict) and isinstance(got.get("docs"), dict) and isinstance(got.get("sizes"), dict) and (
                (installed and set(got["docs"]) == set(got["sizes"])) or
                (sig is not None and got["sizes"] == {r: n for r, n in sig})):
            _DOCS[key] = got["docs"]
            return got["docs"]
    except (OSError, ValueError, RecursionError, AttributeError):
        pass  # absent (a checkout before its first gen_docs) or damaged: parse the YAML
    from .catalog import parse_yaml as parse
    sig = sig if sig is not None else _signature(root)
    parsed = {s[0]: parse(_read(root, s[0])) for s in sig}
    _DOCS[key] = parsed
    return parsed


def compile_all(root: Path) -> str:
    """The artefact's text (scripts/gen_docs.py): every YAML document under root and each file's size.
    A document JSON cannot carry exactly (a YAML-only type) is an error here, at build time."""
    from .catalog import parse_yaml as parse
    sig = _signature(root)
    docs = {r: parse(_read(root, r)) for r, _ in sig}
    try:
        text = json.dumps({"sizes": {r: n for r, n in sig}, "docs": docs}, sort_keys=True, separators=(",", ":"))
    except TypeError as exc:
        raise ValueError(f"a shipped YAML document does not survive JSON: {exc}") from None
    if json.loads(text)["docs"] != docs:
        raise ValueError("a shipped YAML document does not survive JSON exactly")
    return text + "\n"
