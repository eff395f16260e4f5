"""Python API: the same engine and checks as the CLI, returning a Report instead of exiting.

    report = ckptdoctor.verify("/ckpt/run7", select=["CKD1"], num_experts=64)
    if report.failed(): ...
"""
from __future__ import annotations

from .engine.errors import UsageError
from .engine.finding import Report
from .engine.runner import Engine
from .engine.selection import Selection


def make_engine(command: str, target: str, *, select=None, ignore=None, severity=None,
                fail_on: str | None = None, config: str | None = None, isolated: bool = True,
                debug: bool = False, progress=None, **options) -> Engine:
    """The engine a subcommand runs on.  The API ignores config files unless `isolated=False` (then
    `config`, $CKPTDOCTOR_CONFIG or the nearest ckptdoctor.toml applies, as on the command line);
    explicit arguments win over the file, options left None fall back to the file's table."""
    from .engine import config as cfg
    s = cfg.load(config, isolated)
    if select:
        s.select = list(select)
    if ignore:
        s.ignore = s.ignore + list(ignore)
    if fail_on:
        s.fail_on = fail_on
    if s.fail_on not in ("error", "warning", "info"):
        raise UsageError(f"fail-on {s.fail_on!r}: use error, warning or info")
    s.severity.update(severity or {})
    opts = dict(s.options.get(command, {}))
    opts.update({k: v for k, v in options.items() if v is not None})
    n = opts.get("num_experts")  # from the command line, the API or a config file alike
    if n is not None and (type(n) is not int or n < 1):  # 0 or fewer would switch CKD109 off unseen
        raise UsageError(f"--num-experts {n!r}: the model's expert count, a positive integer")
    eng = Engine(command, target, Selection(s.select, s.ignore, s.severity), fail_on=s.fail_on,
                 options=opts, debug=debug, progress=progress, acknowledge=s.acknowledge)
    eng.report.config = s.source
    return eng


def verify(path: str, *, layout: str | None = None, target: str = "all", select=None, ignore=None,
           severity=None, fail_on: str = "error", **options) -> Report:
    """Structural verify (and `checksums=True` for content) of a checkpoint or run root;
    `target="resume"` is the relaunch gate (only what the framework will load decides)."""
    from .commands import verify as flow
    eng = make_engine("verify", path, select=select, ignore=ignore, severity=severity, fail_on=fail_on,
                      **options)
    flow.run(path, eng, layout=layout, target=target)
    return eng.report


def forensics(logs: list[str], *, run_root: str | None = None, select=None, ignore=None, severity=None,
              fail_on: str = "error") -> Report:
    """The first checkpoint-related failure in a failed job's logs (`facts["first_failure"]`, its
    `class`, `timed_out_ranks`); with `run_root`, the checkpoint the log names is verified too."""
    from .commands import forensics as flow
    eng = make_engine("forensics", logs[0], select=select, ignore=ignore, severity=severity, fail_on=fail_on)
    flow.run(list(logs), eng, run_root, lambda path: make_engine("verify", path))
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

    Returns a PublishResult; raises ckptdoctor.publishing.flow.PublishRefused (its `.report` holds
    the source's findings) when the source fails verification and `force` is False."""
    from .commands import publish as flow
    from .publishing.flow import PublishRefused
    from .report.progress import Progress
    eng = make_engine("publish", src, progress=None if quiet else (lambda total, label: Progress(total, label)))
    res = flow.run(src, dest_root, eng, name=name, force=force, replace=replace, tracker=tracker,
                   keep_last=keep_last, keep_every=keep_every, workers=workers)
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
