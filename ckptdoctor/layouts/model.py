"""Views of what is on disk: one checkpoint directory, or a run root holding many.

Views list each directory once and parse each binary file at most once (cached), so every
check can ask for what it needs without re-reading storage.  `RunView.resume_target` is the one
answer to "what will the framework load", used by verify, preflight, publish retention and
reconcile.
"""
from __future__ import annotations

import functools
import os
import time
from ..values import value, field
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from ..io.fs import Entry, Storage, open_regular
from ..io.unpickle import RefusedGlobal
from . import dcp, trackers
from .spec import Layout, is_literal, match_any

MAX_METADATA_BYTES = 4 << 30

if __import__("sys").version_info >= (3, 12):
    cached = functools.cached_property
else:
    class cached(functools.cached_property):
        """functools.cached_property as Python 3.12 has it: before 3.12 its __get__ holds one lock per
        property for every instance, so 64 threads listing 512 node views' checkpoints ran one
        listing at a time (13 s instead of 1 s at 2 ms per call; benchmarks/latency_bench.py)."""

        def __get__(self, instance, owner=None):
            if instance is None:
                return self
            cache = instance.__dict__
            val = cache.get(self.attrname, cache)
            if val is cache:
                val = cache[self.attrname] = self.func(instance)
            return val


@value(frozen=True)
class MetadataProblem:
    file: str
    message: str
    refused_global: str | None = None


@value(frozen=True)
class DcpRead:
    """A checkpoint's DCP metadata, read once: the parsed metadata (None when no file parsed) and
    what went wrong with each metadata file."""
    metadata: dcp.DcpMetadata | None
    problems: tuple[MetadataProblem, ...] = ()


class CheckpointView:
    def __init__(self, storage: Storage, rel: str, layout: Layout | None, step: int | None = None,
                 run: "RunView | None" = None):
        self.storage, self.rel, self._layout, self.step, self.run = storage, rel, layout, step, run
        self._decide = None   # decides the layout from the listing when first asked (see `layout`)
        self.display = storage.show(rel)
        self.name = rel.rsplit("/", 1)[-1] if rel else storage.display.rstrip("/").rsplit("/", 1)[-1]
        self.results: dict[str, Any] = {}  # per-view results shared by the checks of one area
        self.only: str | None = None  # `verify FILE`: the one entry this view holds
        # False: the shards' bytes are not read (CKD105): the relaunch gate reads only the checkpoint
        # the framework will load (issue 42: 3 x 4,096 shard opens at 2 ms per open cost 25 s serially)
        self.read_data = True

    def __str__(self):
        return self.display

    @property
    def layout(self) -> Layout | None:
        """The family's checkpoint layout.  A run root's checkpoint is told apart from its siblings'
        layouts by its own listing, made when something first asks: the relaunch gate never lists
        the checkpoints older than a complete resume target (issue 42)."""
        decide = self._decide
        if decide is not None:   # set only once decided: a second thread asking meanwhile decides too
            self._layout, self._decide = decide(self) or self._layout, None
        return self._layout

    @layout.setter
    def layout(self, layout: Layout | None) -> None:
        self._layout, self._decide = layout, None

    def path(self, name: str) -> str:
        return self.storage.show(self.storage.join(self.rel, name))

    def relpath(self, name: str) -> str:
        return self.storage.join(self.rel, name)

    @cached
    def entries(self) -> dict[str, Entry]:
        return {e.name: e for e in self.storage.listdir(self.rel) if self.only is None or e.name == self.only}

    def _memo(self) -> dict:
        """Answers derived from the listing, kept until the view is given a new listing (a re-list
        after a fix): the rules ask one checkpoint of 4,096 shards for its files ~55 times."""
        ents = self.entries
        memo = self.__dict__.get("_derived")
        if memo is None or memo[0] is not ents:
            memo = self.__dict__["_derived"] = (ents, {})
        return memo[1]

    @property
    def files(self) -> dict[str, Entry]:
        """Name -> entry of every non-directory (shared: read it, never change it)."""
        memo = self._memo()
        got = memo.get("files")
        if got is None:
            got = memo["files"] = {n: e for n, e in self.entries.items() if not e.is_dir}
        return got

    @property
    def dirs(self) -> dict[str, Entry]:
        return {n: e for n, e in self.entries.items() if e.is_dir}

    def matching(self, patterns: tuple[str, ...]) -> list[Entry]:
        """The entries whose names match any of `patterns`, sorted by name.  Remembered per listing:
        the rules ask one checkpoint the same few pattern groups ~9 times each, and scanning 4,096
        names every time was a third of the relaunch gate's CPU (0.45 of 1.3 s on 3 x 4,096 shards,
        which at 2 ms per metadata call kept it above 2x the parallel find; issue 42)."""
        memo = self._memo()
        got = memo.get(patterns)
        if got is None:
            ents = self.entries
            if all(is_literal(p) for p in patterns):  # `.metadata`, `metadata.json`: looked up, not scanned
                got = [ents[n] for n in sorted(set(patterns)) if n in ents]
            else:
                got = [e for n, e in sorted(ents.items()) if match_any(n, patterns)]
            memo[patterns] = got
        return list(got)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    @property
    def newest_mtime(self) -> float | None:
        ms = [e.mtime for e in self.entries.values() if e.mtime]
        return max(ms) if ms else None

    # -- DCP metadata, read once ------------------------------------------------------------
    def metadata_files(self) -> list[str]:
        names = [n for n in self.files if n == ".metadata" or dcp.RANK_METADATA_RE.match(n)]
        return sorted(names, key=lambda n: (n != ".metadata", n))

    @cached
    def dcp(self) -> DcpRead:
        names = self.metadata_files()
        if ".metadata" in names:
            names = [".metadata"]  # the global file wins; per-rank files are the no-collective variant
        md: dcp.DcpMetadata | None = None
        problems: list[MetadataProblem] = []
        for name in names:
            try:
                md = self._parse_metadata(name, md)
            except RefusedGlobal as exc:
                problems.append(MetadataProblem(name, f"refused to unpickle global {exc.qualname}: "
                                                      f"DCP metadata never references it",
                                                exc.qualname))
            except (dcp.MetadataError, ValueError) as exc:
                problems.append(MetadataProblem(name, str(exc)))
            except RecursionError:
                problems.append(MetadataProblem(name, "nested too deeply to be DCP metadata"))
            except OSError as exc:
                problems.append(MetadataProblem(name, f"cannot read: {exc.strerror or exc}"))
        return DcpRead(md, tuple(problems))

    def _parse_metadata(self, name: str, md):
        """A local file is unpickled as it is read (its bytes never all in memory beside the
        objects); a remote one is fetched whole first.  Either way bounded by MAX_METADATA_BYTES."""
        rel = self.relpath(name)
        if not getattr(self.storage, "local", False):
            return dcp.parse(self.storage.read(rel, MAX_METADATA_BYTES), into=md)
        fd = open_regular(self.storage.abspath(rel))
        with os.fdopen(fd, "rb", buffering=1 << 20) as fh:
            size = os.fstat(fd).st_size
            if size > MAX_METADATA_BYTES:
                raise ValueError(f"{name}: {size} bytes, larger than the {MAX_METADATA_BYTES}-byte limit")
            return dcp.parse_file(_Bounded(fh, size), size, into=md)


class _Bounded:
    """A read-only view of a file that ends at `size` bytes even if the file grows meanwhile: what
    the unpickler reads is the file as it was measured, never more."""
    __slots__ = ("fh", "left", "size", "start")

    def __init__(self, fh, size: int):
        self.fh, self.left, self.size, self.start = fh, size, size, fh.tell()

    def rewind(self) -> None:
        """Back to the first byte, for a second reader of the same measured bytes."""
        self.fh.seek(self.start)
        self.left = self.size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        b = self.fh.read(n)
        self.left -= len(b)
        return b

    def readinto(self, buf) -> int:
        view = memoryview(buf)[:self.left]
        k = self.fh.readinto(view)
        self.left -= k
        return k

    def readline(self, limit: int = -1) -> bytes:
        n = self.left if limit is None or limit < 0 else min(limit, self.left)
        b = self.fh.readline(n)
        self.left -= len(b)
        return b

    def peek(self, n: int = 0) -> bytes:
        """The C unpickler prefetches through peek (one call per 128 KiB instead of one per read)."""
        return self.fh.peek(n)[:self.left]


@value
class CheckpointStatus:
    view: CheckpointView
    complete: bool = True
    reasons: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)   # complete, but a check could not be made
    findings: int = 0
    added: list = field(default_factory=list)  # the Findings this checkpoint's checks produced


class RunView:
    def __init__(self, storage: Storage, layout: Layout, entries: dict[str, Entry]):
        self.storage, self.layout, self.entries = storage, layout, entries
        self.display = storage.display
        self.checkpoints: list[CheckpointView] = []
        self.status: dict[str, CheckpointStatus] = {}
        # verify sets it: a checkpoint not judged yet is judged the first time a rule needs its
        # status (the relaunch gate leaves checkpoints older than a complete target unjudged).
        self.judge = None

    def __str__(self):
        return self.display

    def step_of(self, name: str) -> int | None:
        return self.layout.steps.step(name)

    def status_of(self, c: CheckpointView) -> CheckpointStatus:
        """`c`'s verdict, judged now if nothing has judged it yet (without a judge: complete)."""
        s = self.status.get(c.name)
        if s is None:
            if self.judge is None:
                return CheckpointStatus(c)
            s = self.status[c.name] = self.judge(c)
        return s

    def complete(self) -> list[CheckpointView]:
        return [c for c in self.checkpoints if self.status_of(c).complete]

    def newest_complete(self) -> CheckpointView | None:
        """Judged newest first, so a complete newest checkpoint answers without the older ones."""
        stepped = sorted((c for c in self.checkpoints if c.step is not None), key=lambda c: c.step, reverse=True)
        return next((c for c in stepped if self.status_of(c).complete), None)

    @cached
    def tracker(self) -> trackers.TrackerState:
        """The run layout's tracker file, read once."""
        spec = self.layout.tracker
        if spec is None:
            return trackers.TrackerState(None)
        e = self.entries.get(spec.file)
        if e is None:
            return trackers.TrackerState(spec, e)
        if spec.parse == "symlink":
            return trackers.TrackerState(spec, e, trackers.parse_link(self.storage, spec.file, e))
        if e.is_dir or not e.is_file:
            return trackers.TrackerState(spec, e, trackers.TrackerValue(
                "", None, "tracker is not a regular file (a directory, FIFO or device): the framework "
                          "cannot read it"))
        try:
            raw = self.storage.read(spec.file, trackers.MAX_TRACKER_BYTES)
        except ValueError:
            return trackers.TrackerState(spec, e, trackers.TrackerValue(
                "", None, f"tracker is larger than {trackers.MAX_TRACKER_BYTES} bytes"))
        except OSError as exc:
            return trackers.TrackerState(spec, e, trackers.TrackerValue(
                "", None, f"cannot read the tracker: {exc.strerror or exc}"))
        return trackers.TrackerState(spec, e, trackers.parse(self.layout, raw))

    @property
    def resume_target(self) -> str | None:
        """What the framework will load, by its own rules (not ckptdoctor's)."""
        policy = self.layout.resume
        names = {c.name for c in self.checkpoints}
        if policy == "tracker":
            t = self.tracker.target
            return t if t in names else None
        stepped = [c for c in self.checkpoints if c.step is not None]
        if policy == "newest-dir":
            return max(stepped, key=lambda c: c.step).name if stepped else None
        if policy == "newest-with-marker":   # listed newest first: the older ones only while none has it
            stepped.sort(key=lambda c: c.step, reverse=True)
            return next((c.name for c in stepped if c.matching(self.layout.resume_markers)), None)
        return None


def age_seconds(mtime: float | None) -> float | None:
    return None if mtime is None else max(0.0, time.time() - mtime)
