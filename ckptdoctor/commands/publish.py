"""publish flow: verify the source with the shared engine, then commit it (ckptdoctor.publishing.flow)."""
from __future__ import annotations

import os

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
        res = pf.publish(pf.destination(dest_root), src, name, ck.layout.name, markers, **common)
    except OSError as exc:
        raise InputError(f"publish: {exc}") from None
    rep.facts["published"] = res.to_json()
    return res
