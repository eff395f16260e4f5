"""preflight: can every rank of this allocation read what it will load?  Subject: a Preflight.

A gap in the checkpoint the job will resume from is an error; the same gap in an older checkpoint
is a warning (it only matters if you fall back to it).
"""
from __future__ import annotations

from ..engine.finding import Hit
from ..engine.registry import check
from ..slurm.hostlist import compress


def _sev(pf, name: str) -> str:
    return "error" if name == pf.target else "warning"


def _ranks(rs: list[int]) -> str:
    rs = sorted(set(rs))
    if len(rs) > 6:
        return f"{len(rs)} ranks ({rs[0]}..{rs[-1]})"
    return "rank" + ("s " if len(rs) > 1 else " ") + ",".join(map(str, rs))



def _what(rel: str, name: str | None) -> str:
    """A file of a checkpoint, named for a message (a single-file checkpoint is the file itself)."""
    return f"checkpoint file {rel}" if rel == name else f"{rel} of {name or 'the checkpoint'}"

@check("CKD401", "preflight")
def rank_files_missing(pf, eng):
    for name, v in pf.verdicts.items():
        by_node: dict[str, list] = {}
        for g in v.missing:
            by_node.setdefault(g.node, []).append(g)
        for node, gaps in by_node.items():
            ranks = sorted({r for g in gaps for r in g.ranks})
            per_rank: dict[int, list[str]] = {}
            for g in gaps:
                for r in g.ranks:
                    per_rank.setdefault(r, []).append(g.rel)
            unreadable = [g.rel for g in gaps if g.why == "unreadable"]
            what = "missing" if not unreadable else "unreadable" if len(unreadable) == len(gaps) else \
                "missing or unreadable"
            yield Hit(gaps[0].path, f"node {node}: {len(gaps)} shard file(s) of {v.name or 'the checkpoint'} "
                      f"{what} for {_ranks(ranks)} (e.g. {gaps[0].rel})", severity=_sev(pf, name),
                      details={"node": node, "checkpoint": v.name, "ranks": ranks,
                               "files": [g.rel for g in gaps][:50], "unreadable": unreadable[:50],
                               "files_by_rank": {str(r): sorted(fs)[:50] for r, fs in list(per_rank.items())[:100]},
                               "key_model": v.key_model},
                      hint=_where_else(pf, name, [g.rel for g in gaps], node))
    for step, d in pf.nvrx.items():
        if d["owners_missing"]:
            name = f"iter_{step:07d}"
            yield Hit(pf.display, f"local checkpoint iteration {step}: no node of the allocation holds "
                      f"{_ranks(d['owners_missing'])} (primary or replica)", severity=_sev(pf, name),
                      details={"iteration": step, "owners_missing": d["owners_missing"][:100]},
                      hint="those ranks' local checkpoints (and their replicas) were on nodes outside this "
                           "allocation; fall back to an older iteration or the persistent checkpoint")


def _where_else(pf, name, rels: list[str], node: str) -> str:
    """Where the files a node lacks are: on other nodes of this allocation, nowhere in it, or (with
    --local, which sees one node) unknown."""
    if pf.local:
        return ("this node does not hold them; --local sees only this node, so they may be on another node "
                "of the allocation or outside it: copy them here, or judge the whole allocation "
                "(preflight --views, or LOCATION with {node})")
    if pf.shared:
        return "restore them on the shared storage (from the old node set or durable storage) before relaunching"
    held: dict[str, list[str]] = {}
    for n in pf.nodes_checked:
        ck = pf.views[n].checkpoints.get(name) if n != node else None
        for rel in rels if ck else ():
            if rel in ck.files:
                held.setdefault(rel, []).append(n)
    nowhere = [r for r in rels if r not in held]
    parts = [f"{rel} is on {compress(ns)}" for rel, ns in list(held.items())[:3]]
    if len(held) > 3:
        parts.append(f"{len(held) - 3} more on other nodes of this allocation")
    if nowhere:
        parts.append(f"{len(nowhere)} file(s) (e.g. {nowhere[0]}) are on no node of this allocation: copy them "
                     f"from the old node set or from durable storage")
    if held:
        parts.append("the ranks moved to another node: copy the files over or keep the old rank placement")
    return "; ".join(parts)


@check("CKD402", "preflight")
def rank_file_short(pf, eng):
    for name, v in pf.verdicts.items():
        for g in v.short:
            yield Hit(g.path, f"node {g.node}: {g.rel} is {g.actual} bytes, .metadata needs at least "
                      f"{g.expected} ({_ranks(g.ranks)})", severity=_sev(pf, name),
                      details={"node": g.node, "checkpoint": v.name, "expected_bytes": g.expected,
                               "actual_bytes": g.actual, "ranks": g.ranks},
                      hint="the node-local copy is truncated; re-copy it before relaunching")


@check("CKD403", "preflight")
def global_file_missing(pf, eng):
    for name, v in pf.verdicts.items():
        for g in v.global_missing:
            why = {"missing": "missing", "unreadable": "unreadable (permission denied)"}.get(g.why, g.why)
            yield Hit(g.path, f"node {g.node}: {_what(g.rel, v.name)} is {why}, and "
                      f"every rank on the node reads it ({_ranks(g.ranks)})", severity=_sev(pf, name),
                      details={"node": g.node, "checkpoint": v.name, "file": g.rel, "ranks": g.ranks, "why": g.why},
                      hint="global files must be on every node (or on shared storage)" if g.why == "missing" else
                      "replace it with a regular, readable copy of the file (verify says what is wrong with it)")
    for node in pf.nodes_checked:
        view = pf.views[node]
        if view.kind == "run" and view.tracker_file and view.tracker is None and pf.any_tracker:
            yield Hit(view.show(view.tracker_file), f"node {node}: no {view.tracker_file}: the ranks on this "
                      f"node would start from step 0 (resume_mode=auto) while others resume",
                      details={"node": node, "file": view.tracker_file, "ranks": pf.alloc.ranks_of(node)},
                      hint="copy the tracker to every node (it is a global file)")


@check("CKD404", "preflight")
def tracker_disagrees(pf, eng):
    exp = pf.expect
    if exp is not None and exp.step != pf.target_step:
        here = f"node {pf.local}" if pf.local else "this allocation"
        has = f"{pf.target} (step {pf.target_step})" if pf.target else "nothing (it would start from scratch)"
        yield Hit(pf.display, f"{here} would resume from {has}, but the job expects step {exp.step} "
                  f"({exp.source}): ranks would resume from different checkpoints",
                  details={"resume_from": pf.target, "resume_step": pf.target_step, "expected_step": exp.step,
                           "expected_from": exp.source, "node": pf.local},
                  hint="copy the expected checkpoint and tracker to this node, or relaunch with the step every "
                       "node holds")
    seen = {n: (t or "").strip() for n, t in pf.trackers().items() if t is not None}
    if len(set(seen.values())) > 1:
        groups: dict[str, list[str]] = {}
        for n, t in seen.items():
            groups.setdefault(t, []).append(n)
        desc = "; ".join(f"{compress(ns)}: {t!r}" for t, ns in groups.items())
        yield Hit(pf.display, f"the tracker differs between nodes ({desc}): ranks would resume from "
                  f"different checkpoints", details={"trackers": {n: t for n, t in seen.items()}},
                  hint="make every node's tracker name the same checkpoint (the newest all ranks can reach)")


@check("CKD405", "preflight")
def node_set_changed(pf, eng):
    old = pf.writer_nodes
    if not old:
        return
    now = pf.alloc.nodes
    left = [n for n in old if n not in now]
    joined = [n for n in now if n not in old]
    if left or joined:
        yield Hit(pf.display, f"the node set differs from the one that wrote {pf.target}: "
                  f"left {compress(left) if left else 'none'}, joined {compress(joined) if joined else 'none'}",
                  details={"left": left, "joined": joined, "writer_nodes": old},
                  hint="node-local shards of the nodes that left are not readable by this allocation")


@check("CKD406", "preflight")
def resume_unreachable(pf, eng):
    best = pf.newest_reachable()
    if pf.dangling:
        node, named = pf.dangling
        yield Hit(pf.display, f"the tracker on node {node} names {named}, which does not exist there: the "
                  f"job would fail to load (or start from scratch); newest checkpoint every rank can read: "
                  f"{best or 'none'}", details={"resume_from": None, "tracker_names": named, "node": node,
                                                  "newest_reachable": best},
                  hint=(f"point the tracker at {best} or restore the missing checkpoint" if best else
                        "restore the missing checkpoint; nothing is readable by every rank"))
        return
    if pf.target is None:
        if not best and (pf.verdicts or pf.nvrx):
            yield Hit(pf.display, "no checkpoint is readable by every rank of this allocation",
                      hint="restore the missing shards or change the node list")
        return
    v = pf.verdicts.get(pf.target)
    ok = v.reachable if v else (pf.target == best)
    if not ok:
        yield Hit(pf.display, f"the job would resume from {pf.target or 'this checkpoint'}, which not every "
                  f"rank can read; "
                  f"newest checkpoint every rank can read: {best or 'none'}",
                  details={"resume_from": pf.target, "newest_reachable": best},
                  hint=(f"point the tracker at {best} or restore the missing files" if best else
                        "restore the missing files; nothing is readable by every rank"))


@check("CKD407", "preflight")
def node_location_missing(pf, eng):
    for node in pf.nodes_checked:
        v = pf.views[node]
        fresh = v.absent and pf.allow_fresh and not any(pf.has_checkpoint(n) for n in pf.nodes_checked)
        if v.problem and not fresh:  # a declared fresh start may find its directory not made yet
            yield Hit(v.location, f"node {node}: {v.problem}", details={"node": node,
                                                                       "ranks": pf.alloc.ranks_of(node)},
                      hint="every node of the allocation needs its copy of the checkpoint")


@check("CKD408", "preflight")
def world_size_changed(pf, eng):
    for name, v in pf.verdicts.items():
        if v.extra_ranks:
            # with read sets from .metadata, what each new rank reads was checked file by file
            modelled = v.read_model is not None
            yield Hit(pf.display, f"{v.name or 'the checkpoint'} has shards of ranks "
                      f"{v.extra_ranks[0]}..{v.extra_ranks[-1]}, beyond this allocation's {pf.alloc.world} "
                      f"ranks: the world size changed" + (" (each new rank's reads were checked under the "
                                                           "Shard(0) even split)" if modelled else ""),
                      severity="warning" if pf.shared or modelled else _sev(pf, name),
                      details={"checkpoint": v.name, "extra_ranks": v.extra_ranks[:100], "world": pf.alloc.world},
                      hint="resharding needs every shard readable (shared storage); node-local shards of "
                           "the missing ranks will not be read")
        if v.grid_problem:
            yield Hit(pf.display, f"{v.name or 'the checkpoint'}: {v.grid_problem}", severity=_sev(pf, name),
                      details={"checkpoint": v.name, "world": pf.alloc.world},
                      hint="relaunch with a world size the model-parallel grid divides")


@check("CKD409", "preflight")
def node_without_checkpoint(pf, eng):
    """An empty (or missing) node-local run directory on a node whose job resumes: its ranks would
    start from scratch while the others resume, or hang in the first collective."""
    if pf.shared:
        return
    checked = pf.nodes_checked
    have = [n for n in checked if pf.has_checkpoint(n)]
    empty = [n for n in checked if not pf.has_checkpoint(n) and not pf.views[n].problem]  # missing: CKD407
    if not empty:
        return
    if have or not pf.allow_fresh:
        why = (f"while {compress(have)} hold{'s' if len(have) == 1 else ''} one" if have else
               "and the job does not declare a fresh start" if pf.local else
               "on any node, and the job does not declare a fresh start")
        for n in empty:
            v = pf.views[n]
            yield Hit(v.location, f"node {n}: {v.location} holds no checkpoint {why}: its {_ranks(pf.alloc.ranks_of(n))} would "
                      f"start from scratch while others resume, or hang",
                      details={"node": n, "ranks": pf.alloc.ranks_of(n), "location": v.location,
                               "nodes_with_checkpoints": have},
                      hint="copy the checkpoint to this node (a replacement node's disk is empty) from durable "
                           "storage or a replica; a job that really starts fresh says so with --allow-fresh "
                           "(Prolog wrapper: the word `fresh` in the job comment)")


@check("CKD410", "preflight")
def host_memory_budget(pf, eng):
    """The resume target's load against each node's host memory, by the documented model."""
    v = pf.verdicts.get(pf.target) if pf.target is not None else None
    if v is None or not v.load:
        return
    m = pf.memory_model
    for node, (load, pinned) in sorted(v.load.items()):
        mem = pf.memory.get(node)
        if mem is None or not mem.bytes:
            continue
        peak = m.peak(load, pinned)
        ratio = peak / mem.bytes
        if ratio <= 0.8:
            continue
        gib = 1 << 30
        yield Hit(pf.display, f"node {node}: loading {v.name or 'the checkpoint'} peaks at about {peak / gib:.1f} GiB "
                  f"of host memory ({_ranks(pf.alloc.ranks_of(node))}: {load / gib:.1f} GiB loaded x "
                  f"{m.copy_factor:g}" + (f" + {pinned / gib:.1f} GiB pinned buffers" if m.pinned else "") +
                  f"), {ratio:.0%} of its {mem.bytes / gib:.1f} GiB ({mem.source})",
                  severity="error" if ratio > 1 else "warning",
                  details={"node": node, "checkpoint": v.name, "load_bytes": load, "pinned_bytes": pinned,
                           "copy_factor": m.copy_factor, "pinned_model": m.pinned, "peak_bytes": peak,
                           "memory_bytes": mem.bytes, "memory_source": mem.source, "ratio": round(ratio, 3)},
                  hint="the node would be OOM-killed during the load after the allocation was granted: use more "
                       "nodes (fewer ranks per node), nodes with more memory, or a load that streams")


@check("CKD411", "preflight")
def read_set_undecided(pf, eng):
    """A file some ranks may read is missing on their node, and the checkpoint's metadata alone cannot
    say whether they read it (no read plan was recorded at save time)."""
    for name, v in pf.verdicts.items():
        for g in v.undecided:
            yield Hit(g.path, f"node {g.node}: {_what(g.rel, v.name)} is not there, and "
                      f"{_ranks(g.ranks)} may read it for {g.keys[0]!r}"
                      + (f" (+{len(g.keys) - 1} more keys)" if len(g.keys) > 1 else "") + f": {g.why}",
                      details={"node": g.node, "checkpoint": v.name, "file": g.rel, "ranks": g.ranks,
                               "keys": g.keys, "why": g.why},
                      hint="record the read plan at save time (ckptdoctor.integrations.dcp.ManifestWriter, or "
                           "--read-plan FILE), or copy the file to this node to be safe")
