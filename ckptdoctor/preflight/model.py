"""What a new allocation can read: per node, per checkpoint, per rank (stats and listings only).

Inputs: the node list (hostlist expression), ranks per node (block distribution, or an explicit
rank map), and a location that is either shared (one view for every node) or node-local with a
`{node}` placeholder (one view per node).  Each node's view is listed once; a file is readable by
rank r when it exists, with enough bytes, in the view of the node rank r runs on.  With the full
(non `--local`) check, expected sizes come from `.metadata` (max offset+length per shard).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from ..engine.catalog import data_dir, load_yaml
from ..engine.errors import InputError, TransientError, UsageError
from ..io.fs import Storage, open_location
from ..publishing import naming

MAX_DEPTH = 3


@dataclass(frozen=True)
class Family:
    name: str
    detect: re.Pattern
    rank_file: re.Pattern
    global_files: tuple[str, ...]
    optional_global: tuple[str, ...]
    rank_glob: str = "{rank}"

    def rank_of(self, rel: str) -> int | None:
        m = self.rank_file.search(rel)
        return int(m.group("rank")) if m else None


@lru_cache(maxsize=1)
def config() -> dict:
    return load_yaml(data_dir() / "preflight.yaml")


def families() -> list[Family]:
    return [Family(f["name"], re.compile(f["detect"]), re.compile(f["rank_file"]),
                   tuple(f.get("global_files") or ()), tuple(f.get("optional_global") or ()),
                   f.get("rank_glob", "rank {rank}"))
            for f in config()["families"]]


def family_for(files) -> Family | None:
    for fam in families():
        if any(fam.detect.search(f) for f in files):
            return fam
    return None


@dataclass
class Allocation:
    nodes: list[str]
    ranks_per_node: list[int]
    rank_node: list[str]          # rank -> node
    source: str = ""              # where the node list came from

    @property
    def world(self) -> int:
        return len(self.rank_node)

    def ranks_of(self, node: str) -> list[int]:
        return [r for r, n in enumerate(self.rank_node) if n == node]

    @classmethod
    def block(cls, nodes: list[str], per_node: list[int], source: str = "") -> "Allocation":
        if len(per_node) == 1:
            per_node = per_node * len(nodes)
        if len(per_node) != len(nodes):
            raise UsageError(f"ranks per node lists {len(per_node)} value(s) for {len(nodes)} node(s)")
        if len(set(nodes)) != len(nodes):
            raise UsageError("the node list names a node twice")
        rank_node = [n for n, k in zip(nodes, per_node) for _ in range(k)]
        return cls(nodes, per_node, rank_node, source)


@dataclass
class Ckpt:
    """One checkpoint as one node sees it."""
    name: str
    step: int | None
    files: dict[str, int]           # relative path -> size


@dataclass
class NodeView:
    node: str
    location: str
    storage: Storage | None = None
    problem: str | None = None      # the location could not be opened
    kind: str | None = None         # run | checkpoint | nvrx | None
    checkpoints: dict[str, Ckpt] = field(default_factory=dict)
    tracker_file: str | None = None
    tracker: str | None = None      # raw content, None if absent
    run_files: set[str] = field(default_factory=set)
    nvrx: dict[int, dict[int, set[int]]] = field(default_factory=dict)  # step -> owner -> holders

    def show(self, rel: str = "") -> str:
        return self.storage.show(rel) if self.storage else f"{self.location}/{rel}".rstrip("/")


def _walk(st: Storage, rel: str, depth: int = 0) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in st.listdir(rel):
        p = f"{rel}/{e.name}" if rel else e.name
        if e.is_dir:
            if depth < MAX_DEPTH:
                out.update(_walk(st, p, depth + 1))
        else:
            out[p] = e.size
    return out


def open_view(node: str, location: str, local_only: bool = False) -> NodeView:
    v = NodeView(node, location)
    try:
        v.storage = open_location(location)
    except TransientError:
        raise
    except InputError as exc:
        v.problem = str(exc).split(": ", 1)[-1]
        return v
    st = v.storage
    try:
        top = st.listdir("")
    except OSError as exc:
        v.problem = f"cannot list: {exc.strerror or exc}"
        return v
    files = {e.name: e.size for e in top if not e.is_dir}
    dirs = [e.name for e in top if e.is_dir]
    v.run_files = set(files)
    # 1) the location is itself one checkpoint
    here = _walk(st, "") if family_for(files) or any(d in ("actor", "critic") for d in dirs) else None
    if here is not None and family_for(here):
        v.kind = "checkpoint"
        name = st.display.rstrip("/").rsplit("/", 1)[-1]
        v.checkpoints[""] = Ckpt(name, None, here)
        return v
    # 2) a run root: checkpoint directories named like a known framework's
    for fmt in naming.formats().values():
        names = [d for d in dirs if fmt.dir_re.match(d)]
        if names:
            v.kind = "run"
            v.tracker_file = fmt.file
            if fmt.file and fmt.file in files:
                try:
                    v.tracker = st.read(fmt.file, 4096).decode("utf-8", "replace")
                except (OSError, ValueError) as exc:
                    v.tracker = f"<unreadable: {exc}>"
            for d in names:
                try:
                    v.checkpoints[d] = Ckpt(d, fmt.step_of(d), _walk(st.sub(d), ""))
                except OSError as exc:
                    v.checkpoints[d] = Ckpt(d, fmt.step_of(d), {})
                    v.problem = f"{d}: cannot list: {exc.strerror or exc}"
            return v
    # 3) nvidia-resiliency-ext local checkpoints: <rank>/iter_*_<owner>_local.pt
    nv = config()["nvrx"]
    rank_dirs = [d for d in dirs if re.match(nv["rank_dir"], d)]
    if rank_dirs:
        rx = re.compile(nv["file"])
        v.kind = "nvrx"
        for d in rank_dirs:
            for e in st.listdir(d):
                m = rx.match(e.name)
                if m and not e.is_dir and e.size > 0:
                    v.nvrx.setdefault(int(m.group("step")), {}).setdefault(int(m.group("owner")), set()).add(int(d))
        return v
    return v


def node_location(template: str, node: str) -> str:
    return template.replace("{node}", node)
