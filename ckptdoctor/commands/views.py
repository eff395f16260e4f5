"""`preflight --views REPORT...`: one judgement over every node's `preflight --local --format json`
report, gathered by the job's first step (issue 14: whole-allocation agreement).

Each node can only see its own disk.  Together they show what none can alone: nodes that would
resume from different checkpoints (CKD404), a node with no checkpoint while others hold one
(CKD409), and a node of the allocation that sent no view at all (CKD407: not judged is not ok).
Every node's own findings are carried over, so the one verdict covers them too.
"""
from __future__ import annotations

from ..engine.catalog import catalog
from ..engine.errors import UsageError
from ..engine.finding import SEVERITIES, Finding, Hit
from ..engine.runner import Engine
from ..slurm.hostlist import compress

MAX_REPORT_BYTES = 64 << 20


def _load(path: str) -> dict:
    from .merge import read_report
    doc = read_report(path, MAX_REPORT_BYTES)
    view = (doc.get("facts") or {}).get("view") if isinstance(doc, dict) else None
    if not isinstance(view, dict) or doc.get("command") != "preflight" or not isinstance(view.get("node"), str) \
            or not isinstance(doc.get("findings"), list):
        raise UsageError(f"{path}: not a `preflight --local --format json` report of one node")
    return doc


def report_files(args: list[str]) -> list[str]:
    """--views arguments: files as given, directories as their *.json files (sorted)."""
    import os
    out = []
    for a in args:
        if os.path.isdir(a):
            out += sorted(os.path.join(a, n) for n in os.listdir(a) if n.endswith(".json"))
        else:
            out.append(a)
    return out


def judge(paths: list[str], engine: Engine, nodes: list[str] | None) -> None:
    docs = []
    for p in paths:  # a node whose preflight died leaves an empty or partial file: a finding, not exit 2
        try:
            docs.append((p, _load(p)))
        except UsageError as exc:
            engine.emit("CKD407", Hit(p, f"{exc}", details={"file": p},
                                      hint="that node's preflight did not finish (timed out, crashed)"))
    views = {}
    for p, d in docs:
        n = d["facts"]["view"]["node"]
        if n in views:
            raise UsageError(f"two views from node {n}: {views[n][0]} and {p}")
        views[n] = (p, d["facts"]["view"])
    cat = catalog()
    for _, d in docs:  # each node's own verdict stays part of the whole one
        for f in d["findings"]:
            if isinstance(f, dict) and f.get("rule") in cat and f.get("severity") in SEVERITIES:
                engine.report.findings.append(Finding(
                    rule=f["rule"], name=cat[f["rule"]].name, severity=f["severity"], path=str(f.get("path", "")),
                    message=str(f.get("message", "")), details=f.get("details") if isinstance(f.get("details"), dict)
                    else {}, hint=f.get("hint") if isinstance(f.get("hint"), str) else None))
    expected = nodes or sorted(views)
    for n in expected:
        if n not in views:
            engine.emit("CKD407", Hit(n, f"node {n}: sent no view (its preflight did not run, crashed or timed "
                                         f"out): the allocation cannot be judged whole",
                                      details={"node": n}, hint="look at that node's step output; rerun"))
    for n in sorted(set(views) - set(expected)):
        engine.emit("CKD407", Hit(n, f"node {n}: a view from a node outside the allocation {compress(expected)}",
                                  details={"node": n}, hint="pass only this job's views"))
    mine = {n: v for n, (_, v) in views.items() if n in expected}
    targets: dict[str, list[str]] = {}
    for n, v in mine.items():
        if v.get("checkpoints"):
            targets.setdefault(str(v.get("resume_from")), []).append(n)
    if len(targets) > 1:
        desc = "; ".join(f"{compress(sorted(ns))}: {t}" for t, ns in sorted(targets.items()))
        engine.emit("CKD404", Hit("allocation", f"nodes would resume from different checkpoints ({desc})",
                                  details={"resume_from": {n: mine[n].get("resume_from") for n in sorted(mine)}},
                                  hint="make every node hold and name the same checkpoint (the newest all hold)"))
    have = sorted(n for n, v in mine.items() if v.get("checkpoints"))
    # a node whose own report already says it (CKD409 without --allow-fresh, CKD407 for a missing
    # directory) is not reported twice; one whose directory is missing and whose --allow-fresh waived
    # that alone is reported here: the others resume
    said = {(f.rule, (f.details or {}).get("node")) for f in engine.report.findings}
    if have:
        for n, v in sorted(mine.items()):
            if v.get("checkpoints") or ("CKD409", n) in said or ("CKD407", n) in said:
                continue
            if not v.get("problem") or v.get("absent"):
                engine.emit("CKD409", Hit(str(v.get("location", n)), f"node {n}: holds no checkpoint while "
                                          f"{compress(have)} hold{'s' if len(have) == 1 else ''} one: its ranks {v.get('ranks')} would start from "
                                          f"scratch while others resume, or hang",
                                          details={"node": n, "ranks": v.get("ranks"), "nodes_with_checkpoints": have},
                                          hint="copy the checkpoint to this node before relaunching"))
    engine.report.facts["views"] = {"nodes": sorted(views), "expected": expected, "files": [p for p, _ in docs]}
    engine.report.facts["resume_from"] = next(iter(targets)) if len(targets) == 1 else None
