"""`ckptdoctor forensics LOG... [--run-root PATH]`: the first checkpoint-related failure of a failed
job, its class, the ranks that only failed after it, and (with --run-root) the checkpoint it names,
checked by verify with its findings linked to the failure."""
from __future__ import annotations

import os

from ..engine.errors import InputError
from ..engine.runner import Engine
from ..values import field, value


@value
class ForensicsSubject:
    analysis: object
    run_root: str | None = None
    checkpoint: str | None = None
    findings: list = field(default_factory=list)

    @property
    def display(self) -> str:
        return self.analysis.logs[0]


def locate(path: str | None, run_root: str) -> str | None:
    """The file or directory under `run_root` that `path` (as the job saw it, maybe on another
    machine or mount) stands for: the path itself when it is under the run root, else the longest
    tail of it that exists there.  A missing file stands for its directory."""
    if not path or "://" in path:
        return None
    root = os.path.abspath(run_root)
    parts = [p for p in os.path.normpath(path).split(os.sep) if p]
    if os.path.abspath(path).startswith(root + os.sep) and os.path.lexists(path):
        return os.path.abspath(path)
    for k in range(len(parts), 0, -1):
        for tail in (parts[-k:], parts[-k:-1]):
            if tail:
                cand = os.path.join(root, *tail)
                if os.path.lexists(cand):
                    return cand
    return None


def checkpoint_of(found: str, run_root: str) -> str:
    """The checkpoint directory to verify: the directory itself, or the file's directory."""
    d = found if os.path.isdir(found) else os.path.dirname(found)
    return d if d.startswith(os.path.abspath(run_root)) else os.path.abspath(run_root)


def run(logs: list[str], engine: Engine, run_root: str | None, make_verify) -> ForensicsSubject:
    from ..forensics import analyse as A
    from ..forensics.logs import LogError
    try:
        analysis = A.analyse(logs)
    except LogError as exc:
        raise InputError(str(exc)) from None
    sub = ForensicsSubject(analysis, run_root)
    first = analysis.first
    facts = engine.report.facts
    if run_root is not None:
        if not os.path.isdir(run_root):
            raise InputError(f"--run-root {run_root}: not a directory")
        found = locate(first.get("path") if first else None, run_root)
        if found is not None:
            sub.checkpoint = checkpoint_of(found, run_root)
    engine.run_scope("forensics", sub)
    facts["logs"] = {"files": list(logs), "lines": analysis.lines, "timestamps": analysis.timestamps}
    facts["first_failure"] = first
    facts["class"] = first["class"] if first else None
    facts["timed_out_ranks"] = analysis.failed_after
    if sub.checkpoint is not None:
        from . import verify as vflow
        ve = make_verify(sub.checkpoint)
        vflow.run(sub.checkpoint, ve)
        linked = _link(first, sub.checkpoint, ve.report.findings)
        for f in ve.report.findings:
            engine.report.findings.append(f)
        facts["checkpoint"] = {"path": sub.checkpoint, "broken": ve.report.failed(),
                               "findings": [f.rule for f in ve.report.findings],
                               "linked": [{"rule": f.rule, "path": f.path, "message": f.message} for f in linked]}
    return sub


def _link(first: dict | None, ckpt: str, findings: list) -> list:
    """The checkpoint's findings that name the failure's file (or, for a directory, any of its files)."""
    if not first or not findings:
        return []
    name = os.path.basename(os.path.normpath(first.get("path") or ""))
    errors = [f for f in findings if f.severity == "error"]
    named = [f for f in errors if name and (name in f.path or name in f.message)]
    return named or errors
