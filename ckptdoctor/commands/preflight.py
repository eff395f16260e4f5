"""preflight flow: resolve the allocation, open each node's view, run the preflight rules."""
from __future__ import annotations

import json
import os
import socket

from ..engine.errors import InputError, UsageError
from ..engine.runner import Engine
from ..io.fs import read_regular
from ..preflight.analysis import Preflight
from ..preflight.model import Allocation, node_location, open_view
from ..slurm.hostlist import HostlistError, compress, expand, tasks_per_node


LOCAL_TIMEOUT_S = 8.0  # --local (Prolog, first step): below Slurm's default MessageTimeout of 10 s


def allocation(nodelist: str | None, ranks_per_node: str | None, rank_map: str | None) -> Allocation:
    src = "--nodelist"
    if not nodelist:
        for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            if os.environ.get(var):
                nodelist, src = os.environ[var], f"${var}"
                break
    if rank_map:
        return _rank_map(rank_map, nodelist)
    if not nodelist:
        raise UsageError("no node list: pass --nodelist EXPR (or run inside a Slurm job: "
                         "$SLURM_JOB_NODELIST / $SLURM_NODELIST)")
    try:
        nodes = expand(nodelist)
    except HostlistError as exc:
        raise UsageError(f"{src} {nodelist!r}: {exc}") from None
    spec = ranks_per_node or os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    if not spec:
        raise UsageError("ranks per node unknown: pass --ranks-per-node N (or set SLURM_NTASKS_PER_NODE)")
    try:
        per = tasks_per_node(spec, len(nodes))
    except HostlistError as exc:
        raise UsageError(f"--ranks-per-node {spec!r}: {exc}") from None
    return Allocation.block(nodes, per, src)


def _rank_map(path: str, nodelist: str | None) -> Allocation:
    """JSON {"0": "gpu001", ...} or lines 'RANK NODE'; ranks must be 0..W-1."""
    try:
        text = read_regular(path, 16 << 20).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a rank map ({str(exc)[:100]})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read rank map: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
        pairs = {int(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else None
        if pairs is None:
            raise ValueError
    except ValueError:
        pairs = {}
        for i, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[0].isdigit():
                raise InputError(f"{path}:{i}: expected 'RANK NODE', got {line[:60]!r}") from None
            pairs[int(parts[0])] = parts[1]
    if not pairs or sorted(pairs) != list(range(len(pairs))):
        raise InputError(f"{path}: ranks must be exactly 0..W-1 (got {len(pairs)} entries)")
    rank_node = [pairs[r] for r in range(len(pairs))]
    nodes = list(dict.fromkeys(rank_node))
    if nodelist:
        try:
            listed = expand(nodelist)
        except HostlistError as exc:
            raise UsageError(f"--nodelist {nodelist!r}: {exc}") from None
        stray = [n for n in nodes if n not in listed]
        if stray:
            raise InputError(f"{path}: rank map uses node(s) {compress(stray)} outside the node list")
        nodes = listed
    from collections import Counter
    per = Counter(rank_node)
    return Allocation(nodes, [per[n] for n in nodes], rank_node, path)


def expectation(step: int | None, tracker_file: str | None, location: str):
    """--expect-step / --expect-tracker as an Expectation (None when neither is given)."""
    from ..preflight.analysis import Expectation
    if step is not None and tracker_file:
        raise UsageError("--expect-step and --expect-tracker are alternatives: give one")
    if step is not None:
        if step < 0:
            raise UsageError(f"--expect-step {step}: a step is >= 0")
        return Expectation(step, f"--expect-step {step}")
    if not tracker_file:
        return None
    try:
        raw = read_regular(tracker_file, 64 << 10)
    except OSError as exc:
        raise InputError(f"--expect-tracker {tracker_file}: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text) if text.startswith("{") else None
    except ValueError:
        doc = None
    val = next((doc[k] for k in ("step", "iteration", "global_step", "latest") if isinstance(doc, dict) and k in doc),
               None) if doc is not None else text
    import re
    m = re.search(r"(\d+)\s*$", str(val)) if val is not None else None
    if m is None:
        raise InputError(f"--expect-tracker {tracker_file}: no step number in {text[:60]!r}")
    return Expectation(int(m.group(1)), f"--expect-tracker {tracker_file}")


def read_plan(path: str):
    """--read-plan FILE: a ckptdoctor.read_plan/v1 record (or a manifest holding one); bad input is one line."""
    from ..preflight import readsets
    try:
        return readsets.load_read_plan(read_regular(path, readsets.MAX_READ_PLAN_BYTES), path)
    except OSError as exc:
        raise InputError(f"--read-plan {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(f"--read-plan {path}: {exc}") from None


VIEW_SLOW_S = 0.004   # s per node view: measured ~1 ms locally (CPU); >= 6 round trips elsewhere


def run(location: str, engine: Engine, alloc: Allocation, local: bool = False, node: str | None = None,
        allow_fresh: bool = False, expect=None, read_plan=None) -> Preflight:
    from ..preflight import memory
    shared = "{node}" not in location and not local  # --local: LOCATION is this node's own copy
    me = None
    if local:
        me = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        if me not in alloc.nodes:
            raise UsageError(f"--local: this node ({me}) is not in the node list {compress(alloc.nodes)}")
    views = {}
    if shared:
        v = open_view(me or "*", location)
        if v.problem:  # one shared location that is not there: bad input, not a node's fault
            raise InputError(f"{location}: {v.problem}")
        views = {n: v for n in alloc.nodes}
    else:
        # each view is a few round trips (stat, readdir, a stat per file): on a networked filesystem
        # the views are opened together (512 views at 2 ms per call: 45 s serially, see
        # benchmarks/latency_bench.py preflight); locally a view costs ~1 ms of CPU and stays serial
        from ..io.fs import map_io
        names = [me] if me else alloc.nodes
        for n, v in zip(names, map_io(lambda n: open_view(n, node_location(location, n)), names,
                                      slow_s=VIEW_SLOW_S)):
            if isinstance(v, BaseException):
                raise v
            views[n] = v
    pf = Preflight(alloc, views, shared, local=me, parse_metadata=True, display=location,
                   allow_fresh=allow_fresh, expect=expect, read_plan=read_plan,
                   memory=memory.node_memory([me] if me else alloc.nodes, engine.opt("mem_per_node"), me),
                   memory_model=memory.Model(engine.opt("memory_copy_factor", 1.0), engine.opt("memory_pinned", True)))
    engine.run_scope("preflight", pf)
    rep = engine.report
    rep.facts["nodes"] = _node_rows(pf)
    rep.facts["world"] = alloc.world
    rep.facts["allocation_nodes"] = len(alloc.nodes)
    rep.facts["checkpoints"] = [{"name": v.name, "step": v.step, "reachable": v.reachable}
                                for v in pf.verdicts.values()] + \
        [{"name": f"iter_{s:07d}", "step": s, "reachable": not d["owners_missing"]} for s, d in pf.nvrx.items()]
    rep.facts["resume_from"] = pf.target
    rep.facts["newest_reachable"] = pf.newest_reachable()
    rep.facts["local"] = me
    if me:  # what `preflight --views` needs from this node for the whole-allocation judgement
        v = views[me]
        rep.facts["view"] = {"node": me, "location": v.location, "ranks": alloc.ranks_of(me), "kind": v.kind,
                             "problem": v.problem, "absent": v.absent, "tracker": v.tracker,
                             "resume_from": pf.target, "resume_step": pf.target_step,
                             "checkpoints": {n: c.step for n, c in v.checkpoints.items()},
                             "nodelist": compress(alloc.nodes)}
    return pf


def _node_rows(pf: Preflight) -> list[dict]:
    gaps: dict[str, list[int]] = {}  # node -> [all gaps, gaps in the resume target]; one pass over gaps
    for v in pf.verdicts.values():
        for g in v.missing + v.short + v.global_missing:
            c = gaps.setdefault(g.node, [0, 0])
            c[0] += 1
            c[1] += g.checkpoint == pf.target
    rows = []
    for node in pf.nodes_checked:
        ranks = pf.alloc.ranks_of(node)
        v = pf.views[node]
        all_, tgt = gaps.get(node, [0, 0])
        rows.append({"node": node, "ranks": [ranks[0], ranks[-1]] if ranks else [], "location": v.location,
                     "problem": v.problem, "gaps": all_, "gaps_in_resume_target": tgt})
    return rows
