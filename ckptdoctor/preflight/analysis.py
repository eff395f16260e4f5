"""Cross the allocation with the node views: what each rank will miss, per checkpoint.

The result is plain data the rules read (one function per rule in checks/preflight.py) and the
report shows (per-node table, newest step every rank can reach).
"""
from __future__ import annotations

import re
from ..values import value, field
from functools import cached_property
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from ..layouts import dcp as dcp_reader
from . import readsets
from ..layouts.model import MAX_METADATA_BYTES
from ..layouts.spec import Layout
from .model import Allocation, Ckpt, NodeView


@value
class Gap:
    node: str
    checkpoint: str
    path: str                 # as shown to the user (node's view)
    rel: str
    ranks: list[int]
    expected: int | None = None
    actual: int | None = None
    why: str = "missing"      # missing | unreadable (exists, but this user cannot read it) | a reason
    keys: list[str] = field(default_factory=list)   # undecided: the keys that may make these ranks read it


@value
class CkptVerdict:
    name: str
    step: int | None
    family: str | None
    missing: list[Gap] = field(default_factory=list)      # rank files absent on the rank's node
    short: list[Gap] = field(default_factory=list)        # present but fewer bytes than needed
    global_missing: list[Gap] = field(default_factory=list)
    undecided: list[Gap] = field(default_factory=list)    # files some ranks may read (evidence split): warnings
    extra_ranks: list[int] = field(default_factory=list)   # files for ranks >= world

    grid_problem: str | None = None                       # e.g. world not divisible by TP x PP
    read_model: str | None = None                         # how read sets were derived (from .metadata)
    key_model: str | None = None                          # recorded | evidence: per-rank keys told how
    saved_world: int | None = None
    load: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (bytes, pinned bytes) it loads

    @property
    def reachable(self) -> bool:
        return not (self.missing or self.short or self.global_missing or self.grid_problem)


@value(frozen=True)
class Expectation:
    """What the job as a whole will resume from (`--expect-step N`, or `--expect-tracker FILE`, a
    copy of the tracker on durable storage), for a node to compare its own resume target with."""
    step: int | None        # None: the job starts fresh (a tracker copy that names nothing)
    source: str


@value
class Preflight:
    alloc: Allocation
    views: dict[str, NodeView]     # node -> view (the same object for every node when shared)
    shared: bool
    local: str | None = None       # --local: the node this runs on
    parse_metadata: bool = True
    display: str = ""
    allow_fresh: bool = False      # the job declares a fresh start: an empty run directory is fine
    memory: dict = field(default_factory=dict)   # node -> memory.NodeMemory (known ones only)
    memory_model: Any = None                     # memory.Model
    expect: "Expectation | None" = None  # --expect-step / --expect-tracker: the job's resume target
    read_plan: Any = None                # --read-plan: readsets.ReadPlan recorded at save time

    def has_checkpoint(self, node: str) -> bool:
        v = self.views[node]
        return bool(v.checkpoints or v.nvrx)

    @cached_property
    def target_step(self) -> int | None:
        t = self.target
        if t is None:
            return None
        v = self.verdicts.get(t)
        if v is not None and v.step is not None:
            return v.step
        m = re.search(r"(\d+)$", t or "")
        return int(m.group(1)) if m else None

    @property
    def nodes_checked(self) -> list[str]:
        return [self.local] if self.local else self.alloc.nodes

    def ranks_checked(self) -> list[int]:
        return self.alloc.ranks_of(self.local) if self.local else list(range(self.alloc.world))

    @cached_property
    def names(self) -> list[tuple[int | None, str]]:
        seen: dict[str, int | None] = {}
        for n in self.nodes_checked:
            for name, ck in self.views[n].checkpoints.items():
                seen.setdefault(name, ck.step)
        return sorted(((s, n) for n, s in seen.items()), key=lambda t: (t[0] is None, t[0] or 0, t[1]))

    @cached_property
    def verdicts(self) -> dict[str, CkptVerdict]:
        return {name: self._judge(name, step) for step, name in self.names}

    def _copies(self, name: str) -> dict[str, Ckpt]:
        return {n: self.views[n].checkpoints[name] for n in self.nodes_checked if name in self.views[n].checkpoints}

    def _metadata(self, name: str, copies: dict[str, Ckpt], file: str = ".metadata", out: CkptVerdict | None = None):
        """The checkpoint's `.metadata` (or another metadata file), parsed from the first node whose
        copy reads (bounded, regular files only).  A copy that cannot be read or parsed -- a FIFO, a
        device, a truncated pickle -- is a global file its node's ranks cannot read (CKD403), never a
        pass; so is a node's copy whose size differs from the one parsed."""
        if not self.parse_metadata:
            return None
        got, size, src = None, None, None
        for node, ck in copies.items():
            if file not in ck.files:
                continue
            if got is not None:  # the other nodes' copies: by the listing's size, a stat only to say why
                if ck.files[file] != size and out is not None:
                    bad = self._not_regular(node, name, file) or f"{ck.files[file]} bytes, node {src}'s copy has {size}"
                    self._unreadable(out, node, name, file, bad)
                continue
            v = self.views[node]
            rel = self._rel(name, file)
            try:
                got, size, src = dcp_reader.parse(v.storage.read(rel, MAX_METADATA_BYTES)), ck.files[file], node
            except Exception as exc:  # noqa: BLE001 - any failure to read or parse is this node's problem
                if out is not None:
                    why = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).splitlines()[0]
                    shown = v.show(rel)   # the finding names the file already: a long path must not cut the reason
                    why = why[len(shown) + 2:] if why.startswith(shown + ": ") else why
                    self._unreadable(out, node, name, file, why[:160])
                if self.shared:
                    return None
        return got

    def _not_regular(self, node: str, name: str, rel: str) -> str | None:
        """Why a node's local copy of a file is not one a rank can read as a file (a stat, no open)."""
        st = self.views[node].storage
        if st is None or not st.local:
            return None
        import os
        import stat
        try:
            mode = os.stat(st.abspath(self._rel(name, rel))).st_mode
        except OSError as exc:
            return exc.strerror or str(exc)
        return None if stat.S_ISREG(mode) else "not a regular file"

    def _unreadable(self, out: CkptVerdict, node: str, name: str, file: str, why: str) -> None:
        nodes = self.alloc.nodes if self.shared and not self.local else [node]
        for n in nodes:
            out.global_missing.append(Gap(n, name, self._show(n, name, file), file, self.alloc.ranks_of(n),
                                          why=f"unreadable ({why})"))

    def _recorded_plan(self, name: str, copies: dict[str, Ckpt]):
        """The save's read plan: --read-plan, else the `read_plan` of the checkpoint's manifest."""
        if self.read_plan is not None:
            return self.read_plan
        from ..layouts import manifest as mf
        for node, ck in copies.items():
            if mf.NAME in ck.files:
                try:
                    raw = self.views[node].storage.read(self._rel(name, mf.NAME), mf.MAX_MANIFEST_BYTES)
                except OSError:
                    return None  # no usable record: decided by evidence (verify reports the manifest)
                doc = mf.read_plan_of(raw)
                return readsets.parse_read_plan(doc, mf.NAME) if doc is not None else None
        return None

    def _judge(self, name: str, step) -> CkptVerdict:
        copies = self._copies(name)
        union: dict[str, int] = {}
        for ck in copies.values():
            for rel, size in ck.files.items():
                union[rel] = max(size, union.get(rel, 0))
        lay = _reading_layout(copies)
        fam = lay.reads if lay else None
        out = CkptVerdict(name, step, lay.name if lay else None)
        if fam is None:
            return out
        world = self.alloc.world
        md = self._metadata(name, copies, out=out)
        need: dict[str, int] = {}
        files_by_rank: dict[int, set[str]] = {}
        for s in md.storage if md is not None else ():
            end = s.file_offset + s.length
            if end > need.get(s.relative_path, 0):
                need[s.relative_path] = end
        rank_mds = {int(m.group("rank")): rel for rel in union if (m := dcp_reader.RANK_METADATA_RE.match(rel))}
        per_rank_fallback = fam.plan == "dcp-metadata" and ".metadata" not in union and bool(rank_mds)
        if per_rank_fallback:
            # no global .metadata anywhere: torch 2.13 falls back to each rank's __{rank}.metadata
            # (a use_collectives=False save); rank r reads that file and what it names
            out.read_model = "per-rank metadata"
            for r in self.ranks_checked():
                files_by_rank[r] = {f"__{r}.metadata"}
                rmd = self._metadata(name, copies, f"__{r}.metadata", out)
                for s in rmd.storage if rmd is not None else ():
                    files_by_rank[r].add(s.relative_path)
                    end = s.file_offset + s.length
                    if end > need.get(s.relative_path, 0):
                        need[s.relative_path] = end
        elif md is not None and fam.plan == "dcp-metadata":
            rs = readsets.plan(md, world, set(union), self.ranks_checked(), self._recorded_plan(name, copies))
            out.read_model = "resharded: Shard(0) overlap" if rs.resharded else "saved ranks"
            out.key_model = rs.model
            undecided: dict[tuple[str, str], Gap] = {}
            for r in self.ranks_checked():
                node = self.alloc.rank_node[r]
                for rel, u in rs.maybe(r).items():
                    ck = copies.get(node)
                    if ck is None or rel not in ck.files:
                        g = undecided.get((node, rel))
                        if g is None:
                            g = undecided[node, rel] = Gap(node, name, self._show(node, name, rel), rel, [],
                                                           why=u.why, keys=u.keys)
                        g.ranks.append(r)
            out.undecided = list(undecided.values())
            out.saved_world = rs.saved_world
            files_by_rank = {r: rs.files(r) for r in self.ranks_checked()}
            for node in self.nodes_checked:
                per = [rs.load_bytes(r) for r in self.alloc.ranks_of(node)]
                out.load[node] = (sum(b for b, _ in per), sum(p for _, p in per))
            if rs.saved_world and rs.saved_world > world:
                out.extra_ranks = list(range(world, rs.saved_world))
        elif fam.rank_map == "megatron-legacy-grid":
            files_by_rank = _megatron_legacy_ranks(union, world, out)
        else:
            for rel in set(union) | set(need):
                r = fam.rank_of(rel)
                if r is not None:
                    files_by_rank.setdefault(r, set()).add(rel)
        if out.read_model is None:
            out.extra_ranks = sorted(r for r in files_by_rank if r >= world)
        mine = set(self.ranks_checked())
        asked = {(self.alloc.rank_node[r], rel) for r in files_by_rank if r < world and r in mine
                 for rel in files_by_rank[r]}
        for node in self.nodes_checked:
            if copies.get(node) is not None:
                asked.update((node, g) for g in self._globals(fam, name) + list(fam.optional_global))
        self._prefetch_readable(name, [(n, rel) for n, rel in sorted(asked)
                                       if copies.get(n) is not None and rel in copies[n].files])
        miss: dict[tuple[str, str], Gap] = {}
        short: dict[tuple[str, str], Gap] = {}
        for r in sorted(files_by_rank):
            if r >= world or r not in mine:
                continue
            node = self.alloc.rank_node[r]
            ck = copies.get(node)
            for rel in sorted(files_by_rank[r]):
                have = ck.files.get(rel) if ck else None
                shown = self._show(node, name, rel)
                if have is None or not self._readable(node, name, rel):
                    g = miss.setdefault((node, rel), Gap(node, name, shown, rel, [],
                                                         why="missing" if have is None else "unreadable"))
                    g.ranks.append(r)
                elif rel in need and have < need[rel]:
                    short.setdefault((node, rel), Gap(node, name, shown, rel, [], need[rel], have)).ranks.append(r)
        if not self.shared and out.read_model is None and (fam.rank_file is not None or fam.rank_map):
            # node-local: a rank of ours with no file of its own at all (families whose ranks have own files)
            for r in sorted(mine):
                if r < world and r not in files_by_rank:
                    node = self.alloc.rank_node[r]
                    what = fam.rank_glob.format(rank=r)
                    miss.setdefault((node, what), Gap(node, name, self._show(node, name, ""), what, [])).ranks.append(r)
        out.missing = list(miss.values())
        out.short = list(short.values())
        present_anywhere = {g for g in fam.optional_global if g in union}
        for node in self.nodes_checked:
            if self.alloc.ranks_of(node) == [] and not self.local:
                continue
            ck = copies.get(node)
            globals_ = [g for g in self._globals(fam, name) if not (per_rank_fallback and g == ".metadata")]
            for g in globals_ + sorted(present_anywhere):
                if ck is None or g not in ck.files or not self._readable(node, name, g):
                    out.global_missing.append(Gap(node, name, self._show(node, name, g), g,
                                                  self.alloc.ranks_of(node),
                                                  why="missing" if ck is None or g not in ck.files else "unreadable"))
        return out

    def _single(self, name: str) -> bool:
        """Is checkpoint `name` one file of the run root (Composer), not a directory?"""
        return any(v.checkpoints.get(name) is not None and v.checkpoints[name].single for v in self.views.values())

    def _rel(self, name: str, rel: str) -> str:
        """A checkpoint's file, relative to the node's location (a single-file checkpoint's one file
        is the checkpoint itself, in the run root)."""
        return f"{name}/{rel}" if name and not self._single(name) else rel

    @staticmethod
    def _globals(fam, name: str) -> list[str]:
        """The files every rank reads; `{checkpoint}` is the checkpoint's own name (a single file)."""
        return [g.replace("{checkpoint}", name) for g in fam.global_files]

    def _readable(self, node: str, name: str, rel: str) -> bool:
        """Can this user read the file a rank needs?  access(2) on local storage (stats alone said
        ok for a mode-000 shard; the mode bits alone would miss ACLs); object stores answer at read
        time, so they count as readable."""
        known = self.__dict__.setdefault("_access", {}).get((node, name, rel))
        if known is not None:
            return known
        return self._access_one((node, name, rel))

    def _access_one(self, key: tuple[str, str, str]) -> bool:
        node, name, rel = key
        st = self.views[node].storage
        if st is None or not st.local:
            return True
        import os
        return os.access(st.abspath(self._rel(name, rel)), os.R_OK)

    def _prefetch_readable(self, name: str, pairs: list[tuple[str, str]]) -> None:
        """access(2) of every file the loops below will ask about, in one go: each is a round trip
        on a networked filesystem (5,120 of them for 512 node views), issued together there."""
        from ..io.fs import map_io
        keys = [(node, name, rel) for node, rel in pairs]
        cache = self.__dict__.setdefault("_access", {})
        for key, ok in zip(keys, map_io(self._access_one, keys)):
            if isinstance(ok, bool):
                cache[key] = ok

    def _show(self, node: str, name: str, rel: str) -> str:
        v = self.views[node]
        return v.show(self._rel(name, rel))

    # ---- nvidia-resiliency-ext ----------------------------------------------------------------
    @cached_property
    def nvrx(self) -> dict[int, dict]:
        """step -> {'owners_missing': [...], 'holders': {owner: [nodes]}} over the allocation."""
        steps: dict[int, dict[int, set[str]]] = {}
        for n in self.nodes_checked:
            for step, owners in self.views[n].nvrx.items():
                for owner in owners:
                    steps.setdefault(step, {}).setdefault(owner, set()).add(n)
        out = {}
        for step, owners in sorted(steps.items()):
            need = self.ranks_checked() if self.local else range(self.alloc.world)
            out[step] = {"owners_missing": [r for r in need if r not in owners],
                         "holders": {o: sorted(ns) for o, ns in owners.items()}}
        return out

    # ---- verdicts across checkpoints ------------------------------------------------------------
    def newest_reachable(self) -> str | None:
        ok = [(s, n) for s, n in self.names if self.verdicts[n].reachable and self.verdicts[n].family]
        if self.nvrx:
            ok += [(s, f"iter_{s:07d}") for s, d in self.nvrx.items() if not d["owners_missing"]]
        return max(ok, key=lambda t: (t[0] is not None, t[0] or 0))[1] if ok else None

    @cached_property
    def target(self) -> str | None:
        """The checkpoint the framework will resume from: each node's run root judged by its family's
        own rule (`RunView.resume_target`, the same answer verify gives); the first node (rank 0's)
        that has an answer decides."""
        kinds = {self.views[n].kind for n in self.nodes_checked}
        if "checkpoint" in kinds:
            return ""
        if "nvrx" in kinds:
            steps = [s for s in self.nvrx]
            return f"iter_{max(steps):07d}" if steps else None
        for node in self.nodes_checked:
            run = self.views[node].run
            if run is not None and run.resume_target is not None:
                return run.resume_target
        return None

    @cached_property
    def dangling(self) -> tuple[str, str] | None:
        """(node, name) when a node's tracker names a checkpoint that node does not hold."""
        for node in self.nodes_checked:
            run = self.views[node].run
            if run is None or run.layout.resume != "tracker":
                continue
            named = run.tracker.target
            if named is not None and named not in {c.name for c in run.checkpoints}:
                return node, named
        return None

    @property
    def any_tracker(self) -> bool:
        return any(self.views[n].tracker is not None for n in self.nodes_checked)

    @cached_property
    def writer_nodes(self) -> list[str] | None:
        """Nodes that wrote the resume target, from its ckptdoctor manifest (`nodes`), if recorded."""
        import json
        from ..layouts import manifest as mf
        name = self.target
        if name is None:
            return None
        for node in self.nodes_checked:
            v = self.views[node]
            ck = v.checkpoints.get(name)
            if ck and mf.NAME in ck.files:
                try:
                    doc = json.loads(v.storage.read(self._rel(name, mf.NAME), mf.MAX_MANIFEST_BYTES))
                except (OSError, ValueError):
                    return None
                nodes = doc.get("nodes") if isinstance(doc, dict) else None
                return [str(x) for x in nodes] if isinstance(nodes, list) else None
        return None

    def trackers(self) -> dict[str, str | None]:
        return {n: self.views[n].tracker for n in self.nodes_checked if self.views[n].kind == "run"}


def _reading_layout(copies: dict[str, Ckpt]) -> Layout | None:
    """The checkpoint's layout as the nodes see it: the first copy whose family says what ranks read."""
    lays = [c.layout for c in copies.values() if c.layout is not None]
    return next((l for l in lays if l.reads is not None), lays[0] if lays else None)


_MP_DIR = re.compile(r"^mp_rank_(?P<tp>\d+)(?:_(?P<pp>\d{3}))?(?:_(?P<ep>\d{3}))?/(?P<file>[^/]+\.pt)$")


def _megatron_legacy_ranks(union: dict[str, int], world: int, out: CkptVerdict) -> dict[int, set[str]]:
    """Megatron legacy: one mp_rank_TT[_PPP] directory per (tensor, pipeline) rank; every
    data-parallel replica reads the same files.  Global rank order is tp fastest, then dp, then
    pp (Megatron's default 'tp-cp-ep-dp-pp' with cp = ep = 1)."""
    cells: dict[tuple[int, int], set[str]] = {}
    with_pp = False
    for rel in union:
        m = _MP_DIR.match(rel)
        if m:
            with_pp = with_pp or m.group("pp") is not None
            cells.setdefault((int(m.group("tp")), int(m.group("pp") or 0)), set()).add(rel)
    if not cells:
        return {}
    tp_n = max(t for t, _ in cells) + 1
    pp_n = max(p for _, p in cells) + 1
    if world % (tp_n * pp_n):
        out.grid_problem = f"world size {world} is not a multiple of TP {tp_n} x PP {pp_n}"
        return {}
    dp_n = world // (tp_n * pp_n)
    files = sorted({f.split("/", 1)[1] for rels in cells.values() for f in rels})
    by_rank: dict[int, set[str]] = {}
    for r in range(world):
        tp, pp = r % tp_n, r // (tp_n * dp_n)
        d = f"mp_rank_{tp:02d}_{pp:03d}" if with_pp else f"mp_rank_{tp:02d}"
        by_rank[r] = {f"{d}/{f}" for f in files}
    return by_rank
