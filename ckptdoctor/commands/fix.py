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

import contextlib
import datetime as _dt
import os
from ..values import value, field

from ..engine.errors import UsageError
from ..io.atomic import fsync_dir, rename_noreplace, replace_file, replace_symlink, write_new
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
                quarantine: bool, say, dry_run: bool = False, allow_fresh: bool = False):
    """The whole `verify --fix`: judge, plan, say the plan, apply it; then judge the repaired run as
    the relaunch gate does (`target` is only the report's: the exit status is the gate's).

    What is written is decided under the run root's lock (the one publish and prune hold while they
    move the tracker or delete): a first, read-only judgement finds whether there is anything to do
    (when not, nothing is written, not even the lock file); then, under the lock, the run root is
    judged again and the plan made from that judgement alone, so a publish that landed a new
    checkpoint meanwhile is seen, not undone.  Returns the engine whose report is the verdict."""
    from . import verify as vflow

    def judge_and_plan():
        eng = make_engine()
        rep, runv = vflow.judge(location, eng, layout, "resume", allow_fresh)
        if runv is None or rep.facts.get("kind") != "run":
            raise UsageError("--fix repairs a run root (the tracker or the newest directory), not a single checkpoint")
        return eng, runv, plan(runv, fix_to, quarantine)

    eng, runv, p = judge_and_plan()
    if p.to is not None and not dry_run:
        with _locked(location):
            eng, runv, p = judge_and_plan()   # the judgement the write is made from
            if p.to is not None:
                _say_plan(say, p, False)
                apply(runv, p)
        if p.to is not None:
            eng = make_engine()
            vflow.run(location, eng, layout=layout, target="resume", allow_fresh=allow_fresh)  # the repaired run
            eng.report.facts["fixed"] = dict(p.to_json(), applied=True, dry_run=False)
            return eng
    if p.to is None:
        say(f"verify --fix: nothing to do: {p.reason}")
    else:
        _say_plan(say, p, True)
    eng.report.facts["fixed"] = dict(p.to_json(), applied=False, dry_run=dry_run)
    return eng


def _say_plan(say, p: FixPlan, dry_run: bool) -> None:
    say(f"verify --fix{' --dry-run' if dry_run else ''}: {p.reason}")
    for line in p.lines():
        say(f"  {'would ' if dry_run else ''}{line}")


def _locked(location: str):
    """The run root's lock for a local, writable root (one that cannot be repaired here is judged
    without it: apply() refuses it with its own message)."""
    import contextlib
    if "://" in location and not location.startswith("file://"):
        return contextlib.nullcontext()
    root = location[len("file://"):] if location.startswith("file://") else location
    if not os.path.isdir(root) or not os.access(root, os.W_OK | os.X_OK):
        return contextlib.nullcontext()
    return LocalDest(root).lock()


def plan(runv: RunView, fix_to: int | None, quarantine: bool) -> FixPlan:
    """What to change so the framework resumes from a complete checkpoint.  Only a broken, dangling
    or absent resume target is repaired: a tracker on an older complete checkpoint may be a deliberate
    rollback (CKD114 reports it) and is left alone unless --fix-to names a step."""
    lay = runv.layout
    t = lay.tracker
    link = t is not None and t.parse == "symlink"   # Composer's latest-rank0.pt: repointed as a link
    has_tracker = t is not None and (t.content or link) and not t.monitoring
    if quarantine and has_tracker:
        raise UsageError(f"verify --fix --quarantine: {lay.family} resumes from its tracker "
                         f"({t.file}); --fix repoints it, and nothing is renamed")
    complete = {c.name: c for c in runv.complete() if c.step is not None}
    if fix_to is not None:
        want = next((c for c in complete.values() if c.step == fix_to), None)
        if want is None:
            raise UsageError(f"--fix-to {fix_to}: no complete checkpoint at step {fix_to} "
                             f"(complete: {', '.join(sorted(complete)) or 'none'})")
    else:
        want = runv.newest_complete()
    current = runv.resume_target
    if fix_to is None and current is not None and current not in complete and current in runv.status \
            and runv.status[current].complete:   # a complete target without a step (a link copied as a file)
        return FixPlan(None, reason=f"the framework already resumes from {current}, which is complete")
    if fix_to is None and current is not None and current in complete:
        newer = want.name if want is not None and want.name != current else None
        return FixPlan(None, reason=f"the framework already resumes from {current}, which is complete"
                       + (f" ({newer} is newer and complete: a rollback to {current} is left as it is; "
                          f"--fix-to {want.step} moves it)" if newer else ""))
    if want is None:
        return FixPlan(None, reason="no complete checkpoint to resume from; nothing was changed (the "
                                    "findings above say why each one is incomplete)")
    if current == want.name:
        return FixPlan(None, reason=f"the framework already resumes from {want.name}, which is complete")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if has_tracker:
        old = runv.tracker.value.raw if runv.tracker.value else None
        if link and runv.tracker.entry is not None and not runv.tracker.entry.is_link:
            raise UsageError(f"verify --fix: {t.file} is not a symbolic link (a copy that followed links?); "
                             f"it is left as it is: move it aside and run --fix again")
        new = want.name if link else trackers.render(lay, want.name)
        return FixPlan(want.name, tracker={"file": t.file, "old": old, "new": new, "symlink": link,
                                           "backup": f"{t.file}.ckptdoctor-bak-{stamp}" if old is not None else None},
                       reason=f"the framework would resume from {current or 'nothing'}; {want.name} is the "
                              + ("newest complete checkpoint" if fix_to is None else "one asked for"))
    if lay.resume in ("newest-dir", "newest-with-marker"):
        if not quarantine:
            raise UsageError(f"verify --fix: {lay.family} has no tracker (it resumes from the newest directory); "
                             f"pass --quarantine to rename the broken newer checkpoint(s) out of its way")
        if not lay.quarantine:
            raise UsageError(f"verify --fix --quarantine: no quarantine name is known for {lay.family}")
        if not runv.storage.local:   # (an object store's old broken checkpoint met an AttributeError below)
            raise UsageError(f"verify --fix: {runv.display} is not a local directory; repair it where it is mounted")
        newer = [c for c in runv.checkpoints if c.step is not None and c.step > want.step]
        _refuse_in_flight(newer)
        moves = [(c.name, lay.quarantine.format(step=c.step, name=c.name, stamp=stamp)) for c in newer
                 if _real_dir(runv, c.name)]
        return FixPlan(want.name, quarantine=moves,
                       reason=f"the framework would resume from {current or 'nothing'}; quarantining "
                              f"{len(moves)} newer checkpoint(s) makes it resume from {want.name}")
    raise UsageError(f"verify --fix: {lay.family} picks its resume target in a way ckptdoctor cannot change")


def _refuse_in_flight(newer) -> None:
    """A broken checkpoint written to within the in-flight window (the one part publishes use,
    rules/publish.yaml `parts_stale_seconds`) may be a save in progress -- shards and no marker yet is
    exactly how one looks -- and is never renamed from under its writer."""
    from ..layouts.model import age_seconds
    from ..publishing import naming
    window = float(naming.config()["parts_stale_seconds"])
    for c in newer:
        try:
            age = age_seconds(c.newest_mtime)
        except OSError:
            continue
        if age is not None and age < window:
            raise UsageError(f"verify --fix --quarantine: {c.name} was written {age:.0f} s ago and may be a save "
                             f"in progress; nothing was renamed (run it again once no job writes there, or "
                             f"{window - age:.0f} s from now)")


def _real_dir(runv: RunView, name: str) -> bool:
    """Only a real directory is ever renamed (never a symlink, a regular file or a FIFO)."""
    import stat
    try:
        return stat.S_ISDIR(os.lstat(runv.storage.abspath(name)).st_mode)
    except OSError:
        return False


def apply(runv: RunView, p: FixPlan) -> None:
    st = runv.storage
    if not st.local:
        raise UsageError(f"verify --fix: {runv.display} is not a local directory; repair it where it is mounted")
    root = st.abspath("")
    if not os.access(root, os.W_OK | os.X_OK):
        raise UsageError(f"verify --fix: {root} is not writable; nothing was changed")
    dest = LocalDest(root)
    # the caller (run_and_fix) holds the run root's lock: the one publish holds while it moves the tracker
    if p.tracker and p.tracker.get("symlink"):
        _repoint_link(root, p.tracker)
    elif p.tracker:
        path = os.path.join(root, p.tracker["file"])
        current = dest.read_file(p.tracker["file"])
        if current is not None:  # the old tracker's exact bytes, kept beside it
            _keep_backup(root, p.tracker, lambda b: write_new(b, current))

        def unchanged():
            if dest.read_file(p.tracker["file"]) != current:
                raise UsageError(f"{path} changed while being repaired; nothing written (run it again)")
        with _backup_dropped_if_refused(root, p.tracker if current is not None else None):
            replace_file(path, p.tracker["new"].encode(), before_rename=unchanged)
    for a, b in p.quarantine:
        rename_noreplace(os.path.join(root, a), os.path.join(root, b))
    if p.quarantine:
        fsync_dir(root)


def _repoint_link(root: str, tr: dict) -> None:
    """A symlink tracker: the old link kept beside it as a link (its target is the backup), the new
    one swapped in atomically, and only if the link still points where the judgement saw it."""
    path = os.path.join(root, tr["file"])

    def now() -> str | None:
        try:
            return os.readlink(path)
        except FileNotFoundError:
            return None
        except OSError:
            return "\0not a link"
    current = now()
    if current != tr["old"]:
        raise UsageError(f"{path} changed while being repaired; nothing written (run it again)")
    if current is not None:
        _keep_backup(root, tr, lambda b: os.symlink(current, b))

    def unchanged():
        if now() != current:
            raise UsageError(f"{path} changed while being repaired; nothing written (run it again)")
    with _backup_dropped_if_refused(root, tr if current is not None else None):
        replace_symlink(path, tr["new"], before_rename=unchanged)


def _keep_backup(root: str, tr: dict, create) -> None:
    """The old tracker kept beside it under the first free name: a repair refused by a race and run
    again within the same second (what its message asks) met its own backup's name and crashed."""
    base = tr["backup"] or f"{tr['file']}.ckptdoctor-bak"
    for n in range(1, 100):
        name = base if n == 1 else f"{base}-{n}"
        try:
            create(os.path.join(root, name))
        except FileExistsError:
            continue
        tr["backup"] = name
        return
    raise UsageError(f"verify --fix: {base} and 98 more backups exist beside {tr['file']}; nothing written")


@contextlib.contextmanager
def _backup_dropped_if_refused(root: str, tr: dict | None):
    """A repair refused ("nothing written") takes back the backup it made for it."""
    try:
        yield
    except UsageError:
        if tr is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, tr["backup"]))
        raise
