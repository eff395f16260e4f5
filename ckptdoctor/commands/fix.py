"""`verify RUN_ROOT --fix`: make the framework resume from a complete checkpoint, without deleting
or moving any checkpoint's data.

Families with a tracker: the tracker is repointed (atomically, after a timestamped backup of the
old one) to the newest complete checkpoint, or to `--fix-to STEP`.  Families whose framework picks
the newest directory: with `--quarantine`, each broken checkpoint newer than the chosen one is
renamed to the family's quarantine name, which that framework's own pattern does not match (the
rename is atomic and reversible; nothing is deleted).  Object stores and read-only run roots are
refused.
"""
from __future__ import annotations

import datetime as _dt
import os
from ..values import value, field

from ..engine.errors import UsageError
from ..io.atomic import fsync_dir, rename_noreplace, replace_file, write_new
from ..layouts import trackers
from ..layouts.model import RunView
from ..publishing.dest import LocalDest


@value
class FixPlan:
    to: str | None                      # the complete checkpoint the framework will resume from after
    tracker: dict | None = None         # {"file", "old", "new", "backup"}
    quarantine: list[tuple[str, str]] = field(default_factory=list)  # (from, to)
    reason: str = ""

    def to_json(self) -> dict:
        return {"to": self.to, "tracker": self.tracker, "quarantine": [list(q) for q in self.quarantine],
                "reason": self.reason}

    def lines(self) -> list[str]:
        out = []
        if self.tracker:
            out.append(f"repoint {self.tracker['file']}: {(self.tracker['old'] or '').strip() or '(missing)'} -> "
                       f"{self.tracker['new']} (backup {self.tracker['backup'] or 'none: it did not exist'})")
        out += [f"rename {a} -> {b} (the framework ignores that name; nothing is deleted)" for a, b in self.quarantine]
        return out


def run_and_fix(location: str, make_engine, *, layout: str | None, target: str, fix_to: int | None,
                quarantine: bool, say):
    """The whole `verify --fix`: judge, plan, say the plan, apply it, judge the repaired run.
    Returns the engine whose report is the verdict."""
    from . import verify as vflow
    eng = make_engine()
    rep, runv = vflow.judge(location, eng, layout, target)
    if runv is None or rep.facts.get("kind") != "run":
        raise UsageError("--fix repairs a run root (the tracker or the newest directory), not a single checkpoint")
    p = plan(runv, fix_to, quarantine)
    if p.to is None:
        say(f"verify --fix: nothing to do: {p.reason}")
        return eng
    say(f"verify --fix: {p.reason}")
    for line in p.lines():
        say(f"  {line}")
    apply(runv, p)
    eng = make_engine()
    vflow.run(location, eng, layout=layout, target=target)  # judge the repaired run
    eng.report.facts["fixed"] = p.to_json()
    return eng


def plan(runv: RunView, fix_to: int | None, quarantine: bool) -> FixPlan:
    lay = runv.layout
    complete = {c.name: c for c in runv.complete() if c.step is not None}
    if fix_to is not None:
        want = next((c for c in complete.values() if c.step == fix_to), None)
        if want is None:
            raise UsageError(f"--fix-to {fix_to}: no complete checkpoint at step {fix_to} "
                             f"(complete: {', '.join(sorted(complete)) or 'none'})")
    else:
        want = runv.newest_complete()
    current = runv.resume_target
    if want is None:
        raise UsageError("verify --fix: no complete checkpoint to resume from; nothing was changed")
    if current == want.name and fix_to is None:
        return FixPlan(None, reason=f"the framework already resumes from {want.name}, which is complete")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    t = lay.tracker
    if t is not None and t.content and not t.monitoring:
        old = runv.tracker.value.raw if runv.tracker.value else None
        return FixPlan(want.name, tracker={"file": t.file, "old": old, "new": trackers.render(lay, want.name),
                                           "backup": f"{t.file}.ckptdoctor-bak-{stamp}" if old is not None else None},
                       reason=f"the framework would resume from {current or 'nothing'}; {want.name} is the "
                              + ("newest complete checkpoint" if fix_to is None else "one asked for"))
    if lay.resume in ("newest-dir", "newest-with-marker"):
        if not quarantine:
            raise UsageError(f"verify --fix: {lay.family} has no tracker (it resumes from the newest directory); "
                             f"pass --quarantine to rename the broken newer checkpoint(s) out of its way")
        if not lay.quarantine:
            raise UsageError(f"verify --fix --quarantine: no quarantine name is known for {lay.family}")
        newer = [c for c in runv.checkpoints if c.step is not None and c.step > want.step]
        moves = [(c.name, lay.quarantine.format(step=c.step, name=c.name, stamp=stamp)) for c in newer]
        return FixPlan(want.name, quarantine=moves,
                       reason=f"the framework would resume from {current or 'nothing'}; quarantining "
                              f"{len(moves)} newer checkpoint(s) makes it resume from {want.name}")
    raise UsageError(f"verify --fix: {lay.family} picks its resume target in a way ckptdoctor cannot change")


def apply(runv: RunView, p: FixPlan) -> None:
    st = runv.storage
    if not st.local:
        raise UsageError(f"verify --fix: {runv.display} is not a local directory; repair it where it is mounted")
    root = st.abspath("")
    if not os.access(root, os.W_OK | os.X_OK):
        raise UsageError(f"verify --fix: {root} is not writable; nothing was changed")
    dest = LocalDest(root)
    with dest.lock():  # the same lock publish holds while it moves the tracker
        if p.tracker:
            path = os.path.join(root, p.tracker["file"])
            current = dest.read_file(p.tracker["file"])
            if current is not None:  # the old tracker's exact bytes, kept beside it
                p.tracker["backup"] = p.tracker["backup"] or f"{p.tracker['file']}.ckptdoctor-bak"
                write_new(os.path.join(root, p.tracker["backup"]), current)

            def unchanged():
                if dest.read_file(p.tracker["file"]) != current:
                    raise UsageError(f"{path} changed while being repaired; nothing written (run it again)")
            replace_file(path, p.tracker["new"].encode(), before_rename=unchanged)
        for a, b in p.quarantine:
            rename_noreplace(os.path.join(root, a), os.path.join(root, b))
        if p.quarantine:
            fsync_dir(root)
