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
