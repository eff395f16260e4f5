"""Checkpoint families (rules/layouts/<family>.yaml): one description every subcommand reads.

A family file holds an optional `run:` layout (a run root: how step directories are named, the
tracker and how the framework picks its resume target, staging names) and `checkpoints:` layouts
(one checkpoint directory: detection, commit markers, temp names, required files, what each rank
reads on resume).  `verify`, `preflight`, `publish` (tracker format, retention, staging names) and
`reconcile` (run-root step directories) all read these values; no subcommand branches on names.

Patterns in `detect`, `markers`, `temp`, `required` are shell globs on names in one directory;
`steps.pattern` and `reads.rank_file` are regular expressions (ASCII, full match for steps).
Every key is checked when the file is loaded: an unknown key is an error naming file and key.
"""
from __future__ import annotations

import fnmatch
import functools
import re
from ..values import value, field
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from ..engine.catalog import data_dir, load_yaml
from ..engine.errors import UsageError


class _Fields(dict):
    def __missing__(self, key):
        return 0


@value(frozen=True)
class StepNaming:
    """How a family names step directories: parse a name to a step, build a name from a step
    (the idea of Orbax's NameFormat).  Names that match without a step group (Megatron `release`)
    count as step 0.  `kind` says what a step entry is: a directory (every family but one) or a
    single file (Composer's `ep0-ba4-rank0.pt`)."""
    pattern: re.Pattern
    format: str
    kind: str = "dir"

    @property
    def files(self) -> bool:
        return self.kind == "file"

    def entries(self, files, dirs) -> list[str]:
        """The names among a run root's listing that are step entries of this kind."""
        return [n for n in (files if self.files else dirs) if self.matches(n)]

    def example(self) -> str:
        """A name the format makes, for messages."""
        return self.build(0)

    def matches(self, name: str) -> bool:
        return self.pattern.fullmatch(name) is not None

    def step(self, name: str) -> int | None:
        m = self.pattern.fullmatch(name)
        if not m:
            return None
        s = m.groupdict().get("step")
        return int(s) if s is not None else 0

    def build(self, step: int) -> str:
        """The name of `step` (other fields of the format, e.g. Composer's epoch, as 0)."""
        return self.format.format_map(_Fields(step=step))

    def fields(self, name: str) -> dict[str, str] | None:
        m = self.pattern.fullmatch(name)
        return None if m is None else {k: v for k, v in m.groupdict().items() if v is not None}


@value(frozen=True)
class TrackerSpec:
    """The file a framework reads to pick its resume target, and how it parses and writes it."""
    file: str
    parse: str                       # int | int-or-release | tag | json:<key> | symlink
    content: str | None = None       # what the framework's writer puts there ({step} or {tag}); None: never written
    release_dir: str | None = None
    monitoring: bool = False         # a status file the framework does not resume from


@value(frozen=True)
class Reads:
    """What each rank reads on resume (preflight): its own files and the files every rank reads."""
    rank_file: re.Pattern | None = None   # a path whose `rank` group names the rank that reads it
    rank_glob: str = "{rank}"             # how to name a rank's files in a message
    global_files: tuple[str, ...] = ()
    optional_global: tuple[str, ...] = ()  # global when some node has them
    rank_map: str | None = None           # a named mapping implemented in code (megatron-legacy-grid)
    plan: str | None = None               # "dcp-metadata": read sets from `.metadata` (preflight/readsets.py);
                                          # rank_file is the fallback when no node has the metadata

    def rank_of(self, rel: str) -> int | None:
        m = self.rank_file.search(rel) if self.rank_file else None
        return int(m.group("rank")) if m else None


@value(frozen=True)
class Layout:
    name: str
    family: str
    title: str
    scope: str  # "run" or "checkpoint"
    priority: int
    detect_files: tuple[str, ...] = ()
    detect_dirs: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()      # names that make it match inside its own run layout
    names: tuple[str, ...] = ()       # directory names that break ties between content matches
    child_files: tuple[str, ...] = ()  # run layouts: a checkpoint child holds one of these
    markers: tuple[tuple[str, ...], ...] = ()
    temp: tuple[str, ...] = ()
    reader: str | None = None
    required: tuple[str, ...] = ()
    optional_archives: tuple[str, ...] = ()
    steps: StepNaming | None = None
    tracker: TrackerSpec | None = None
    staging: tuple[str, ...] = ()     # run layouts: staging names of a step ({step} placeholder)
    quarantine: str | None = None     # run layouts: a name the framework ignores ({step} {name} {stamp})
    resume: str | None = None         # tracker | newest-dir | newest-with-marker
    resume_markers: tuple[str, ...] = ()
    checkpoint_layouts: tuple[str, ...] = ()
    reads: Reads | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def staging_globs(self) -> tuple[str, ...]:
        return tuple(s.replace("{step}", "*") for s in self.staging)

    def staging_for(self, step: int) -> tuple[str, ...]:
        return tuple(s.replace("{step}", str(step)) for s in self.staging)

    def tracker_dir(self, value: str) -> str:
        """The checkpoint directory a tracker value names (by the family's step naming)."""
        if self.steps is not None:
            try:
                return self.steps.build(int(value))
            except ValueError:
                pass
        return value


@value(frozen=True)
class Family:
    name: str
    title: str
    run: Layout | None
    checkpoints: tuple[Layout, ...]
    local: dict[str, str] = field(default_factory=dict)  # node-local per-rank files (nvrx)
    description: str = ""
    source: str = ""


# ---- loading, with every key known and typed -------------------------------------------------
_FAMILY_KEYS = {"family", "title", "description", "run", "checkpoints", "local"}
_LAYOUT_KEYS = {"name", "title", "priority", "description", "detect", "markers", "temp", "reader",
                "required", "optional_archives", "steps", "tracker", "staging", "quarantine", "resume",
                "resume_markers", "checkpoint_layouts", "reads", "extra"}
_DETECT_KEYS = {"files", "dirs", "claims", "names", "child_files"}
_STEPS_KEYS = {"pattern", "format", "kind"}
STEP_KINDS = {"dir", "file"}
_TRACKER_KEYS = {"file", "parse", "content", "release_dir", "monitoring"}
_READS_KEYS = {"rank_file", "rank_glob", "global_files", "optional_global", "rank_map", "plan"}
RESUME_POLICIES = {"tracker", "newest-dir", "newest-with-marker"}


def _keys(d: Any, allowed: set[str], where: str) -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise UsageError(f"{where}: expected a table")
    unknown = set(d) - allowed
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    return d


def _t(v) -> tuple:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


def _layout(d: dict, family: str, scope: str, where: str) -> Layout:
    d = _keys(d, _LAYOUT_KEYS, where)
    if "name" not in d:
        raise UsageError(f"{where}: a layout needs a name")
    det = _keys(d.get("detect"), _DETECT_KEYS, f"{where}.detect")
    steps = tracker = reads = None
    if d.get("steps"):
        s = _keys(d["steps"], _STEPS_KEYS, f"{where}.steps")
        if s.get("kind", "dir") not in STEP_KINDS:
            raise UsageError(f"{where}.steps.kind: {s['kind']!r} is not one of {', '.join(sorted(STEP_KINDS))}")
        steps = StepNaming(re.compile(s["pattern"], re.ASCII), s["format"], s.get("kind", "dir"))
    if d.get("tracker"):
        t = _keys(d["tracker"], _TRACKER_KEYS, f"{where}.tracker")
        tracker = TrackerSpec(t["file"], t.get("parse", "int"), t.get("content"), t.get("release_dir"),
                              bool(t.get("monitoring", False)))
    if d.get("reads"):
        r = _keys(d["reads"], _READS_KEYS, f"{where}.reads")
        reads = Reads(re.compile(r["rank_file"], re.ASCII) if r.get("rank_file") else None,
                      r.get("rank_glob", "{rank}"), _t(r.get("global_files")), _t(r.get("optional_global")),
                      r.get("rank_map"), r.get("plan"))
    resume = d.get("resume")
    if resume is not None and resume not in RESUME_POLICIES:
        raise UsageError(f"{where}.resume: {resume!r} is not one of {', '.join(sorted(RESUME_POLICIES))}")
    if scope == "run" and steps is None:
        raise UsageError(f"{where}: a run layout needs `steps`")
    return Layout(
        name=d["name"], family=family, title=d.get("title", d["name"]), scope=scope,
        priority=int(d.get("priority", 0)), detect_files=_t(det.get("files")), detect_dirs=_t(det.get("dirs")),
        claims=_t(det.get("claims")), names=_t(det.get("names")), child_files=_t(det.get("child_files")),
        markers=tuple(_t(g) for g in (d.get("markers") or ())), temp=_t(d.get("temp")), reader=d.get("reader"),
        required=_t(d.get("required")), optional_archives=_t(d.get("optional_archives")), steps=steps,
        tracker=tracker, staging=_t(d.get("staging")), quarantine=d.get("quarantine"), resume=resume, resume_markers=_t(d.get("resume_markers")),
        checkpoint_layouts=_t(d.get("checkpoint_layouts")), reads=reads, extra=d.get("extra") or {},
        description=(d.get("description") or "").strip())


@functools.lru_cache(maxsize=1)
def families() -> dict[str, Family]:
    out: dict[str, Family] = {}
    for path in sorted((data_dir() / "layouts").glob("*.yaml")):
        d = _keys(load_yaml(path), _FAMILY_KEYS, str(path))
        name = d.get("family") or path.stem
        run = _layout(d["run"], name, "run", f"{path}: run") if d.get("run") else None
        cks = tuple(_layout(c, name, "checkpoint", f"{path}: checkpoints[{i}]")
                    for i, c in enumerate(d.get("checkpoints") or ()))
        out[name] = Family(name, d.get("title", name), run, cks, dict(d.get("local") or {}),
                           (d.get("description") or "").strip(), str(path))
    return out


@functools.lru_cache(maxsize=1)
def layouts() -> dict[str, Layout]:
    out: dict[str, Layout] = {}
    for fam in families().values():
        for lay in ((fam.run,) if fam.run else ()) + fam.checkpoints:
            if lay.name in out:
                raise UsageError(f"{fam.source}: layout {lay.name!r} is defined twice")
            out[lay.name] = lay
    for lay in out.values():
        for c in lay.checkpoint_layouts:
            if c not in out:
                raise UsageError(f"layout {lay.name}: checkpoint layout {c!r} is not defined")
    return out


def run_layouts() -> list[Layout]:
    return [l for l in layouts().values() if l.scope == "run"]


def match_any(name: str, patterns: tuple[str, ...]) -> bool:
    return any(_matcher(p)(name) for p in patterns)


_MAGIC = frozenset("*?[")


def is_literal(pattern: str) -> bool:
    """A pattern that matches only the name it spells (fnmatch's magic characters absent)."""
    return not _MAGIC & set(pattern)


@functools.lru_cache(maxsize=4096)
def _matcher(pattern: str):
    """fnmatchcase(name, pattern) as a function, without compiling a regular expression for the
    shapes family files use most (`.metadata`, `*.distcp`, `iter_*`): detection tries every
    family's patterns, and compiling ~30 of them was 5 ms of a small verify (issue 20)."""
    if is_literal(pattern):
        return pattern.__eq__
    head, star, tail = pattern.partition("*")
    if star and not _MAGIC & set(head + tail):
        n = len(head) + len(tail)
        return lambda s: len(s) >= n and s.startswith(head) and s.endswith(tail)
    return lambda s: fnmatch.fnmatchcase(s, pattern)


def _by_content(layout: Layout, files: set[str], dirs: set[str]) -> bool:
    f = any(match_any(n, layout.detect_files) for n in files) if layout.detect_files else False
    d = any(match_any(n, layout.detect_dirs) for n in dirs) if layout.detect_dirs else False
    return f or d


def fits(layout: Layout, files: set[str], dirs: set[str]) -> bool:
    """Does the directory hold anything of this layout (its own files, or files it claims)?"""
    return _by_content(layout, files, dirs) or any(match_any(n, layout.claims) for n in files | dirs)


def detect(scope: str, files: set[str], dirs: set[str], among: tuple[str, ...] = (),
           name: str = "") -> Layout | None:
    """The layout of `scope` that the directory's content proves.

    Standalone, content decides: of the layouts whose detect patterns match, the one whose `names`
    match the directory name wins a tie, then the higher priority.  A name alone never makes a
    layout (a plain DCP save in `iter_0000100/` is DCP, not Megatron).  Inside a run root (`among` =
    the run layout's checkpoint layouts) a layout also matches by its `claims` (a Megatron run's
    DCP directory without metadata.json is a Megatron save that died before finalize); when no
    layout of the run matches, standalone detection decides.
    """
    if among:
        for n in among:
            lay = layouts().get(n)
            if lay is not None and fits(lay, files, dirs):
                return lay
    cands = [l for l in layouts().values() if l.scope == scope and _by_content(l, files, dirs)]
    if not cands:
        return None
    return max(cands, key=lambda l: (bool(name) and match_any(name, l.names), l.priority))


def get(name: str) -> Layout:
    try:
        return layouts()[name]
    except KeyError:
        raise UsageError(f"unknown layout {name!r}; `ckptdoctor layouts` lists them") from None


def for_tracker_option(option: str) -> Layout:
    """`publish --tracker FAMILY`: the run layout of that family that writes a tracker."""
    fam = families().get(option)
    if fam is None or fam.run is None or fam.run.tracker is None or fam.run.tracker.content is None:
        choices = [f.name for f in families().values() if f.run and f.run.tracker and f.run.tracker.content]
        raise UsageError(f"--tracker {option!r}: use none, auto or one of {', '.join(choices)}")
    return fam.run
