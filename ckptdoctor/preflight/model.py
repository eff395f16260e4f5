"""What a new allocation can read: per node, per checkpoint, per rank (stats and listings only).

Inputs: the node list (hostlist expression), ranks per node (block distribution, or an explicit
rank map), and a location that is either shared (one view for every node) or node-local with a
`{node}` placeholder (one view per node).  Each node's view is listed once; a file is readable by
rank r when it exists, with enough bytes, in the view of the node rank r runs on.  With the full
(non `--local`) check, expected sizes come from `.metadata` (max offset+length per shard).
"""
from __future__ import annotations

import functools
import re
from ..values import value, field

from ..engine.errors import InputError, TransientError, UsageError
from ..io.fs import Storage, TreeLimit, open_location, walk_files
from ..layouts import spec
from ..layouts.locate import locate
from ..layouts.model import RunView
from ..layouts.spec import Layout


MAX_WORLD = 10_000_000


@value
class Allocation:
    nodes: list[str]
    ranks_per_node: list[int]
    rank_node: list[str]          # rank -> node
    source: str = ""              # where the node list came from

    @property
    def world(self) -> int:
        return len(self.rank_node)

    def ranks_of(self, node: str) -> list[int]:
        return self._by_node.get(node, [])

    @functools.cached_property
    def _by_node(self) -> dict[str, list[int]]:
        """node -> its ranks, built once (a scan per node made preflight O(nodes^2): 20k nodes, 29 s)."""
        out: dict[str, list[int]] = {}
        for r, n in enumerate(self.rank_node):
            out.setdefault(n, []).append(r)
        return out

    @classmethod
    def block(cls, nodes: list[str], per_node: list[int], source: str = "") -> "Allocation":
        if len(per_node) != len(nodes):
            raise UsageError(f"ranks per node lists {len(per_node)} value(s) for {len(nodes)} node(s)")
        if len(set(nodes)) != len(nodes):
            raise UsageError("the node list names a node twice")
        if sum(per_node) > MAX_WORLD:
            raise UsageError(f"{sum(per_node)} ranks in all: more than {MAX_WORLD}")
        rank_node = [n for n, k in zip(nodes, per_node) for _ in range(k)]
        return cls(nodes, per_node, rank_node, source)


@value
class Ckpt:
    """One checkpoint as one node sees it."""
    name: str
    step: int | None
    files: dict[str, int]           # relative path -> size
    layout: Layout | None = None
    single: bool = False            # the checkpoint is one file of the run root (Composer)


@value
class NodeView:
    node: str
    location: str
    storage: Storage | None = None
    problem: str | None = None      # the location could not be opened
    absent: bool = False            # ... because it does not exist (a fresh or replaced node-local disk)
    kind: str | None = None         # run | checkpoint | nvrx | None
    run: RunView | None = None
    checkpoints: dict[str, Ckpt] = field(default_factory=dict)
    nvrx: dict[int, dict[int, set[int]]] = field(default_factory=dict)  # step -> owner -> holders

    def show(self, rel: str = "") -> str:
        return self.storage.show(rel) if self.storage else f"{self.location}/{rel}".rstrip("/")

    @property
    def tracker_file(self) -> str | None:
        """The run's resume tracker (not a monitoring status file)."""
        t = self.run.layout.tracker if self.run else None
        return t.file if t and not t.monitoring else None

    @property
    def tracker(self) -> str | None:
        """The tracker's raw content, None if absent."""
        if self.tracker_file is None:
            return None
        v = self.run.tracker.value
        return None if v is None else v.raw


def _files(st: Storage, rel: str, top=None) -> dict[str, int]:
    return walk_files(st, rel, top)


def open_view(node: str, location: str) -> NodeView:
    v = NodeView(node, location)
    try:
        v.storage = open_location(location)
    except TransientError:
        raise
    except InputError as exc:
        v.problem = str(exc).split(": ", 1)[-1]
        v.absent = "no such file or directory" in v.problem.lower()
        return v
    st = v.storage
    try:
        found = locate(st)
    except OSError as exc:
        v.problem = f"cannot list: {exc.strerror or exc}"
        return v
    try:
        local_root = found.checkpoint is not None and bool(spec.families()[found.checkpoint.layout.family].local)
        if found.checkpoint is not None and not local_root:  # the location is itself one checkpoint
            v.kind = "checkpoint"
            ck = found.checkpoint
            v.checkpoints[""] = Ckpt(ck.name, None, _files(st, "", list(ck.entries.values())), ck.layout)
            return v
        if found.run is not None:               # a run root: its family's step directories
            v.kind, v.run = "run", found.run
            for ck in found.run.checkpoints:
                if ck.only is not None:   # one file of the run root: the listing already sized it
                    v.checkpoints[ck.name] = Ckpt(ck.name, ck.step, {ck.only: e.size for e in ck.entries.values()},
                                                  ck.layout, single=True)
                    continue
                try:
                    v.checkpoints[ck.name] = Ckpt(ck.name, ck.step, _files(st, ck.name, list(ck.entries.values())),
                                                  ck.layout)
                except OSError as exc:
                    v.checkpoints[ck.name] = Ckpt(ck.name, ck.step, {}, ck.layout)
                    v.problem = f"{ck.name}: cannot list: {exc.strerror or exc}"
            return v
    except TreeLimit as exc:
        v.problem = str(exc)
        return v
    _nvrx(v, st)
    return v


def _nvrx(v: NodeView, st: Storage) -> None:
    """nvidia-resiliency-ext local checkpoints: <holder rank>/iter_*_<owner>_local.pt."""
    nv = spec.families()["nvrx"].local
    rank_dir, rx = re.compile(nv["rank_dir"], re.ASCII), re.compile(nv["file"], re.ASCII)
    try:
        rank_dirs = [e.name for e in st.listdir("") if e.is_dir and rank_dir.fullmatch(e.name)]
        if not rank_dirs:
            return
        v.kind = "nvrx"
        for d in rank_dirs:
            for e in st.listdir(d):
                m = rx.fullmatch(e.name)
                if m and not e.is_dir and e.size > 0:
                    v.nvrx.setdefault(int(m.group("step")), {}).setdefault(int(m.group("owner")), set()).add(int(d))
    except OSError as exc:
        v.problem = f"cannot list: {exc.strerror or exc}"


def node_location(template: str, node: str) -> str:
    return template.replace("{node}", node)
