"""Layout descriptions (rules/layouts/*.yaml): what a checkpoint family looks like on disk.

Patterns are shell globs on names in one directory.  Run layouts describe a run root (which
child directories are checkpoints, the tracker and how the framework picks a resume target);
checkpoint layouts describe one checkpoint directory (markers, temp names, shards).
"""
from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from typing import Any

from ..engine.catalog import data_dir, load_yaml
from ..engine.errors import UsageError


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    scope: str  # "run" or "checkpoint"
    priority: int
    detect_files: tuple[str, ...] = ()
    detect_dirs: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()      # names that make it match inside its own run layout
    names: tuple[str, ...] = ()       # ... or when the directory itself is named like this
    child_files: tuple[str, ...] = ()  # run layouts: a checkpoint child holds one of these
    markers: tuple[tuple[str, ...], ...] = ()
    temp: tuple[str, ...] = ()
    temp_dirs: tuple[str, ...] = ()
    reader: str | None = None
    required: tuple[str, ...] = ()
    optional_archives: tuple[str, ...] = ()
    checkpoint_dirs: str | None = None
    tracker: dict[str, Any] = field(default_factory=dict)
    resume: str | None = None
    resume_markers: tuple[str, ...] = ()
    checkpoint_layouts: tuple[str, ...] = ()
    shards: str | None = None
    global_files: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @functools.cached_property
    def dir_re(self) -> re.Pattern | None:
        return re.compile(self.checkpoint_dirs) if self.checkpoint_dirs else None


def _t(v) -> tuple:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


KNOWN = {"name", "title", "scope", "priority", "detect", "markers", "temp", "temp_dirs", "reader",
         "required", "optional_archives", "checkpoint_dirs", "tracker", "resume", "resume_markers",
         "checkpoint_layouts", "shards", "global_files", "extra", "description"}


@functools.lru_cache(maxsize=1)
def layouts() -> dict[str, Layout]:
    out: dict[str, Layout] = {}
    for path in sorted((data_dir() / "layouts").glob("*.yaml")):
        d = load_yaml(path) or {}
        unknown = set(d) - KNOWN
        if unknown:
            raise UsageError(f"{path}: unknown layout keys {sorted(unknown)}")
        det = d.get("detect") or {}
        out[d["name"]] = Layout(
            name=d["name"], title=d.get("title", d["name"]), scope=d["scope"],
            priority=int(d.get("priority", 0)), detect_files=_t(det.get("files")),
            detect_dirs=_t(det.get("dirs")), claims=_t(det.get("claims")), names=_t(det.get("names")),
            child_files=_t(det.get("child_files")),
            markers=tuple(_t(g) for g in (d.get("markers") or ())), temp=_t(d.get("temp")),
            temp_dirs=_t(d.get("temp_dirs")), reader=d.get("reader"), required=_t(d.get("required")),
            optional_archives=_t(d.get("optional_archives")), checkpoint_dirs=d.get("checkpoint_dirs"),
            tracker=d.get("tracker") or {}, resume=d.get("resume"),
            resume_markers=_t(d.get("resume_markers")), checkpoint_layouts=_t(d.get("checkpoint_layouts")),
            shards=d.get("shards"), global_files=_t(d.get("global_files")), extra=d.get("extra") or {},
            description=(d.get("description") or "").strip())
    return out


def match_any(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _score(layout: Layout, files: set[str], dirs: set[str], claimed: bool) -> bool:
    f = any(match_any(n, layout.detect_files) for n in files) if layout.detect_files else False
    d = any(match_any(n, layout.detect_dirs) for n in dirs) if layout.detect_dirs else False
    c = claimed and any(match_any(n, layout.claims) for n in files | dirs)
    return f or d or c


def detect(scope: str, files: set[str], dirs: set[str], among: tuple[str, ...] = (),
           name: str = "") -> Layout | None:
    """The layout of `scope` whose detect patterns match the names present.

    Inside a run root (`among` = the run layout's checkpoint layouts) candidates are tried in
    that order and may also match by their `claims`; standalone, by descending priority, with
    `claims` honoured only when the directory's own name matches the layout's `names`.
    """
    if among:
        cands = [layouts()[n] for n in among if n in layouts()]
    else:
        cands = sorted((l for l in layouts().values() if l.scope == scope), key=lambda l: -l.priority)
    for l in cands:
        claimed = bool(among) or (bool(name) and match_any(name, l.names))
        if _score(l, files, dirs, claimed):
            return l
    return None


def get(name: str) -> Layout:
    try:
        return layouts()[name]
    except KeyError:
        raise UsageError(f"unknown layout {name!r}; `ckptdoctor layouts` lists them") from None
