"""publish flow: verify the source with the shared engine, then commit it (ckptdoctor.publishing.flow)."""
from __future__ import annotations

import os
from ..values import value
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Callable

from ..engine.errors import InputError, UsageError
from ..engine.runner import Engine
from ..io.fs import open_location
from ..layouts import spec
from ..layouts.locate import locate
from ..publishing import flow as pf
from ..publishing import naming
from . import verify as vflow


def run(src: str, dest_root: str, engine: Engine, *, name: str | None = None, force: bool = False,
        replace: bool = False, tracker: str = "auto", keep_last: int | None = None,
        keep_every: int | None = None, workers: int | None = None,
        trust_manifest: bool = False) -> pf.PublishResult | None:
    """Returns the result, or None when the source failed verification (findings in the report)."""
    if "://" in src and not src.startswith("file://"):
        raise UsageError(f"{src}: publish copies from a local checkpoint directory (node-local disk)")
    if tracker not in ("auto", "none"):
        spec.for_tracker_option(tracker)  # an unknown family is a usage error before anything is read
    src = src[len("file://"):] if src.startswith("file://") else src
    src = os.path.abspath(src)
    st = open_location(src)
    ck = locate(st).checkpoint
    if ck is None:
        raise UsageError(f"{src}: not a checkpoint directory (give one checkpoint, not a run root)")
    status = vflow.check_checkpoint(engine, ck)
    rep = engine.report
    rep.facts["source"] = {"path": src, "layout": ck.layout.name, "complete": status.complete}
    if not status.complete and not force:
        rep.facts["published"] = None
        rep.facts["refused"] = "the source fails verification; fix it or pass --force"
        return None
    name = name if name is not None else os.path.basename(src.rstrip("/"))
    naming.check_name(name)
    if pf.is_inside(dest_root, src):
        raise UsageError(f"{dest_root}: the destination is inside (or is) the source {src}; publish to "
                         f"another directory")
    if keep_last is not None and keep_last < 1:
        raise UsageError("--keep-last must be at least 1 (the checkpoint just published is always kept)")
    if keep_every is not None and keep_every < 1:
        raise UsageError("--keep-every must be at least 1")

    markers = {m for group in ck.layout.markers for m in group}
    common = dict(replace=replace, tracker=tracker, keep_last=keep_last, keep_every=keep_every,
                  workers=workers, progress_factory=engine.progress, trust_manifest=trust_manifest)
    try:
        res = pf.publish(pf.destination(dest_root), src, name, ck.layout.name, markers,
                         listing=list(ck.entries.values()), **common)   # listed once, by the verify
    except OSError as exc:
        raise InputError(f"publish: {exc}") from None
    rep.facts["published"] = res.to_json()
    return res


@value
class PartJob:
    """What a part publish needs besides its files: the stage (local directory or object prefix),
    the structural verify of the assembled tree, and the after-commit step (tracker, retention)."""
    src: str
    name: str
    spec: "object"
    stage: "object"
    verify: Callable
    after: Callable


def part_job(src: str, dest_root: str, engine: Engine, pspec, *, name: str | None, force: bool, tracker: str,
             keep_last: int | None, keep_every: int | None) -> PartJob:
    """Check the options and build the job; shared by `publish --part` and publish_distributed."""
    from ..publishing import parts
    if "://" in src and not src.startswith("file://"):
        raise UsageError(f"{src}: publish copies from a local checkpoint directory (node-local disk)")
    if tracker not in ("auto", "none"):
        spec.for_tracker_option(tracker)  # an unknown family is a usage error first
    src = os.path.abspath(src[len("file://"):] if src.startswith("file://") else src)
    if not os.path.isdir(src):
        raise UsageError(f"{src}: not a directory (give this node's local checkpoint directory)")
    name = name if name is not None else os.path.basename(src.rstrip("/"))
    naming.check_name(name)
    if pf.is_inside(dest_root, src):
        raise UsageError(f"{dest_root}: the destination is inside (or is) the source {src}")
    if keep_last is not None and keep_last < 1:
        raise UsageError("--keep-last must be at least 1 (the checkpoint just published is always kept)")
    if keep_every is not None and keep_every < 1:
        raise UsageError("--keep-every must be at least 1")
    dest = pf.destination(dest_root)

    def verify(tree: str):
        # judged as the destination run root will judge it (its family from the name and the tracker there)
        parent, base = tree.rsplit("/", 1)
        run_layout = None if tracker == "none" else naming.choose_layout(tracker, base, set(dest.entries()))
        from ..layouts.locate import checkpoint_in_run
        if isinstance(dest, pf.ObjectCommit):
            # the assembly is uncommitted by design until the manifest: CKD201 is the commit's own state
            from ..api import make_engine
            eng = make_engine("verify", tree, ignore=["CKD201"], progress=engine.progress)
            parent = dest.display.rstrip("/")
            waived = {"CKD201"}
        else:
            eng, waived = engine, set()
        ck = checkpoint_in_run(open_location(parent), base, run_layout)
        if ck is None:
            return None, [f"{tree}: the assembled tree is not a checkpoint any family recognises"]
        status = vflow.check_checkpoint(eng, ck)
        if eng is not engine:
            engine.report.findings.extend(f for f in status.added if not f.hidden)
        errors = [f"{f.rule} {f.name}: {f.message}" for f in status.added if f.breaks and f.rule not in waived]
        return ck.layout.name, ([] if not errors or force else errors)

    def after(res, tracker_opt, kl, ke):
        pf._after_commit(dest, name, res, tracker_opt, kl, ke)

    if isinstance(dest, pf.ObjectCommit):
        # no node knows the whole checkpoint's family before the commit: every family's literal
        # marker names wait in the staging prefix and go up last
        markers = {m for lay in spec.layouts().values() for group in lay.markers for m in group
                   if not any(ch in m for ch in "*?[")}
        stage = parts.ObjectParts(dest.fs, dest.root, name, pspec, markers)
    else:
        stage = parts.LocalParts(os.path.abspath(dest_root[len("file://"):] if dest_root.startswith("file://")
                                                 else dest_root), name, pspec)
    return PartJob(src, name, pspec, stage, verify, after)


def run_part(src: str, dest_root: str, engine: Engine, *, part: str, publish_id: str | None,
             timeout: float = 1800.0, name: str | None = None, force: bool = False, replace: bool = False,
             tracker: str = "auto", keep_last: int | None = None, keep_every: int | None = None,
             workers: int | None = None):
    """publish --part K/N: this node's files into the shared staging; the part completing the set
    verifies the assembled checkpoint with the same engine and commits it (publishing/parts/)."""
    from ..publishing import parts
    pspec = parts.PartSpec.parse(part, publish_id)
    if replace:
        raise UsageError("--replace is refused with --part: a part publish only creates a new checkpoint "
                         "(publish under another --name)")
    job = part_job(src, dest_root, engine, pspec, name=name, force=force, tracker=tracker, keep_last=keep_last,
                   keep_every=keep_every)
    rep = engine.report
    rep.facts["source"] = {"path": job.src, "part": pspec.index, "parts": pspec.count,
                           "publish_id": pspec.publish_id}
    try:
        res = parts.run_part(job.src, dest_root, job.name, pspec, verify=job.verify, tracker=tracker,
                             keep_last=keep_last, keep_every=keep_every, workers=workers,
                             progress_factory=engine.progress, timeout=timeout, after_commit_fn=job.after,
                             stage=job.stage)
    except parts.PartRefused as exc:
        rep.facts["published"] = None
        rep.facts["refused"] = str(exc)
        raise
    except OSError as exc:
        raise InputError(f"publish --part: {exc}") from None
    rep.facts["published"] = res.to_json()
    return res
