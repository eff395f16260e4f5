"""Forensics (6xx): a failed job's first checkpoint-related failure, the ranks that only failed after
it, and whether the checkpoint the log names can be found to check (`ckptdoctor forensics`)."""
from __future__ import annotations

from ..engine.finding import Hit
from ..engine.registry import check


def _ranks(rs: list[int]) -> str:
    if not rs:
        return "no rank"
    shown = ", ".join(str(r) for r in rs[:8]) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")
    return f"rank{'s' if len(rs) > 1 else ''} {shown}"


def _where(f: dict) -> str:
    return f"{f['log']}:{f['line']}"


@check("CKD601", "forensics")
def first_failure(sub, eng):
    """The first checkpoint-related failure across ranks: who, which file, which error, which class."""
    f = sub.analysis.first
    if f is None:
        return
    who = (_ranks(f["ranks"]) if f["ranks"] else "the process") + (f" on {f['host']}" if f.get("host") else "")
    exc = f["exception"] or "exit"
    msg = f" ({f['message'][:160]})" if f.get("message") and f["message"] not in (exc,) else ""
    where = f" on {f['path']}" if f.get("path") and f["path"] not in msg else ""
    when = f" at {f['time'][:23]}" if f.get("time") else ""
    what = f["what"] + ("" if f["certain"] else " (likely: nothing in the log says more)")
    yield Hit(_where(f), f"{who} failed first{when}: {exc}{msg}{where} [{f['class']}: {what}]",
              details={"first_failure": f}, hint=_fill(f.get("fix"), sub, f))


def _fill(fix: str | None, sub, f: dict) -> str | None:
    """The class's fix with its placeholders made concrete where the job's own paths tell them:
    CHECKPOINT is the checkpoint the log blames (found under --run-root, else the blamed file's
    directory), RUN_ROOT the --run-root given.  What is not known stays a placeholder."""
    import os
    import shlex
    if not fix:
        return fix
    ck = sub.checkpoint or (os.path.dirname(f["path"]) if f.get("path") and "://" not in f["path"] else None)
    if ck:
        fix = fix.replace("CHECKPOINT", shlex.quote(ck))
    if sub.run_root:
        fix = fix.replace("RUN_ROOT", shlex.quote(sub.run_root))
    return fix


@check("CKD602", "forensics")
def failed_after(sub, eng):
    """Ranks that only failed after the first failure (timeouts, lost peers, stopped by the launcher)."""
    a = sub.analysis
    if a.first is None or not a.failed_after:
        return
    yield Hit(_where(a.first), f"{_ranks(a.failed_after)} only failed after it (a collective timed out or lost "
                               f"its peer, or the launcher stopped them): not the cause",
              details={"ranks": a.failed_after})


@check("CKD603", "forensics")
def nothing_found(sub, eng):
    """Logs without a checkpoint-related failure: said, so that silence is not mistaken for a pass."""
    a = sub.analysis
    if a.first is not None:
        return
    other = a.other[0] if a.other else None
    extra = (f"; the first other failure is {other['exception']} at {other['log']}:{other['line']}"
             if other else "")
    yield Hit(a.logs[0] if len(a.logs) == 1 else f"{len(a.logs)} logs",
              f"no checkpoint-related failure found in {a.lines} line(s) of {len(a.logs)} log(s){extra}",
              details={"other_failures": a.other})


@check("CKD604", "forensics")
def path_not_in_run_root(sub, eng):
    """--run-root given, but the file the log blames is not found under it: nothing could be linked."""
    if sub.run_root is None or sub.analysis.first is None or sub.checkpoint is not None:
        return
    p = sub.analysis.first.get("path")
    why = (f"{p} (from the log) matches nothing under {sub.run_root}" if p else
           "the log names no path for the first failure")
    yield Hit(sub.run_root, f"cannot tell which checkpoint of the run root the job was loading: {why}",
              details={"path": p}, hint="pass the run root the job used (or a copy of it), or verify the "
                                          "checkpoint directly with `ckptdoctor verify`")
