"""Python API: the same engine and checks as the CLI, returning a Report instead of exiting.

    report = ckptdoctor.verify("/ckpt/run7", select=["CKD1"], num_experts=64)
    if report.failed(): ...
"""
from __future__ import annotations

from .engine.finding import Report
from .engine.runner import Engine
from .engine.selection import Selection


def make_engine(command: str, target: str, *, select=None, ignore=None, severity=None,
                fail_on: str = "error", **options) -> Engine:
    return Engine(command, target, Selection(list(select or ["ALL"]), list(ignore or []), dict(severity or {})),
                  fail_on=fail_on, options=options)


def verify(path: str, *, layout: str | None = None, select=None, ignore=None, severity=None,
           fail_on: str = "error", **options) -> Report:
    """Structural verify (and `checksums=True` for content) of a checkpoint or run root."""
    from .commands import verify as flow
    eng = make_engine("verify", path, select=select, ignore=ignore, severity=severity, fail_on=fail_on,
                      **options)
    flow.run(path, eng, layout=layout)
    return eng.report


def reconcile(path: str, *, profile: str | None = None, maps=None, simulate: bool = False, steps: int = 4,
              select=None, ignore=None, severity=None, fail_on: str = "error") -> Report:
    """RL resume-state checks of a step directory, run root or run_state/v1 file (read-only)."""
    from .commands import reconcile as flow
    eng = make_engine("reconcile", path, select=select, ignore=ignore, severity=severity, fail_on=fail_on)
    flow.run(flow.load(path, profile, list(maps or []), steps), eng, simulate=simulate)
    return eng.report


def publish(src: str, dest_root: str, *, name: str | None = None, tracker: str = "auto", replace: bool = False,
            force: bool = False, keep_last: int | None = None, keep_every: int | None = None,
            workers: int | None = None, quiet: bool = True):
    """Publish checkpoint directory `src` to `dest_root/<name>` whole or not at all.

    Returns a PublishResult; raises ckptdoctor.engine.errors.PublishRefused (with the source's
    findings) when the source fails verification and `force` is False."""
    from .commands import publish as flow
    from .publishing.flow import PublishRefused
    eng = make_engine("publish", src)
    res = flow.run(src, dest_root, eng, name=name, force=force, replace=replace, tracker=tracker,
                   keep_last=keep_last, keep_every=keep_every, workers=workers, quiet=quiet)
    if res is None:
        errs = [f for f in eng.report.findings if f.severity == "error"]
        exc = PublishRefused(f"{src}: not published, the source fails verification: " +
                             "; ".join(f"{f.rule} {f.message}" for f in errs[:3]))
        exc.report = eng.report
        raise exc
    return res


def save_and_publish(state_dict, dest_root: str, name: str, *, format: str = "dcp", local_dir: str | None = None,
                     **publish_options):
    """The "local serialize" step, then publish: write `state_dict` to fast local disk (torch DCP
    or a safetensors file), then publish that directory.  The local copy is removed afterwards
    unless `local_dir` was given."""
    import os
    import shutil
    import tempfile
    own = local_dir is None
    base = local_dir or tempfile.mkdtemp(prefix="ckptdoctor-stage-")
    local = os.path.join(base, name)
    os.makedirs(local, exist_ok=True)
    try:
        if format == "dcp":
            import torch.distributed.checkpoint as dcp  # only this path needs torch
            dcp.save(state_dict, checkpoint_id=local)
        elif format == "safetensors":
            from safetensors.torch import save_file
            save_file(state_dict, os.path.join(local, "model.safetensors"))
        else:
            raise ValueError(f"format {format!r}: use 'dcp' or 'safetensors'")
        return publish(local, dest_root, name=name, **publish_options)
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)
