"""What is at a location, by the family descriptions: a run root, one checkpoint, or nothing known.

Every subcommand opens locations through `locate`, so verify, preflight, publish and reconcile
agree on the family, the step directories and (through `RunView.resume_target`) what resumes.
"""
from __future__ import annotations

import functools

from ..values import value

from ..io.fs import Storage
from . import spec
from .model import CheckpointView, RunView


@value
class Located:
    run: RunView | None = None
    checkpoint: CheckpointView | None = None
    misfit: str | None = None   # a forced layout that the directory does not fit: why

    @property
    def kind(self) -> str | None:
        return "run" if self.run else "checkpoint" if self.checkpoint else None

    @property
    def view(self):
        return self.run or self.checkpoint


def _name(st: Storage) -> str:
    return st.display.rstrip("/").rsplit("/", 1)[-1]


def locate(st: Storage, layout_name: str | None = None) -> Located:
    """Decide what the location is.  A forced layout that does not fit is reported in `misfit`
    (the caller turns it into a finding), never silently accepted."""
    entries = {e.name: e for e in st.listdir("")}
    files = {n for n, e in entries.items() if not e.is_dir}
    dirs = {n for n, e in entries.items() if e.is_dir}
    forced = spec.get(layout_name) if layout_name else None
    if forced is not None and forced.scope == "run":
        kids = forced.steps.entries(files, dirs)
        tracker = forced.tracker is not None and forced.tracker.file in files
        if not kids and not tracker:
            return Located(misfit=f"--layout {forced.name}: no {forced.steps.example()!r}-style "
                                  f"checkpoint {'file' if forced.steps.files else 'directory'}"
                                  + (f" and no {forced.tracker.file}" if forced.tracker else "") + " here")
        return Located(run=_run(st, forced, entries, dirs))
    if forced is not None:
        if not spec.fits(forced, files, dirs):
            return Located(misfit=f"--layout {forced.name}: none of its files "
                                  f"({', '.join((forced.detect_files + forced.claims + forced.detect_dirs)[:4])}) "
                                  f"are here")
        return Located(checkpoint=_listed(CheckpointView(st, "", forced), entries))
    run_layout = spec.detect("run", files, dirs) or _by_children(st, dirs)
    own = spec.detect("checkpoint", files, dirs, name=_name(st))
    # a directory that is itself a checkpoint is not a run root (e.g. a Megatron iter dir)
    if run_layout and own and own.priority >= run_layout.priority and \
            not run_layout.steps.entries(files, dirs):
        run_layout = None
    if run_layout:
        return Located(run=_run(st, run_layout, entries, dirs))
    if own is None:
        local = _by_local_files(st, dirs)
        return Located(checkpoint=_listed(CheckpointView(st, "", local), entries)) if local else Located()
    return Located(checkpoint=_listed(CheckpointView(st, "", own), entries))


def _listed(view: CheckpointView, entries: dict) -> CheckpointView:
    """The view of the location itself keeps the listing just made (not listed a second time: on
    a networked filesystem each entry's stat is a round trip)."""
    view.__dict__["entries"] = entries
    return view


# How many times a run root is listed again when its tracker names a directory the listing lacks.
SNAPSHOT_TRIES = 3


def _run(st: Storage, layout: spec.Layout, entries, dirs) -> RunView:
    """The run root as one moment saw it.  Publishers (ours, Megatron's, DeepSpeed's) rename the
    checkpoint in first and write the tracker after, so a commit landing between our listing and our
    tracker read shows a tracker naming a directory the listing lacks: a false CKD113 seen in CI
    while a node committed.  The tracker is read here, before any checkpoint is scanned, and when
    its target is missing the root is listed again: a target renamed in before the tracker named it
    is in that second listing (readdir returns what existed when it began), so what still lacks it
    is a tracker that really dangles."""
    def stepped(entries) -> set[str]:
        return {n for n, e in entries.items() if e.is_dir != layout.steps.files}

    names = stepped(entries)
    for _ in range(SNAPSHOT_TRIES):
        run = RunView(st, layout, entries)
        target = run.tracker.target
        if target is None or target in names:
            break
        try:
            again = {e.name: e for e in st.listdir("")}
        except OSError:
            break
        if again.keys() == entries.keys():
            break
        entries = again
        names = stepped(entries)
    else:
        run = RunView(st, layout, entries)
    for name in sorted(names):
        step = run.step_of(name)
        if step is None or (layout.tracker is not None and name == layout.tracker.file):
            continue
        if layout.steps.files:
            run.checkpoints.append(_file_checkpoint(st, name, layout.checkpoint_layouts, step, run))
        else:
            run.checkpoints.append(_checkpoint(st, name, layout.checkpoint_layouts, step, run))
    t = run.tracker
    if t.spec is not None and t.spec.parse == "symlink" and t.target == t.spec.file:
        # the link was copied as the file it pointed to: that file is what the framework loads
        run.checkpoints.append(_file_checkpoint(st, t.spec.file, layout.checkpoint_layouts, None, run))
    run.checkpoints.sort(key=lambda c: (c.step is not None, c.step or 0, c.name))
    return run


def _by_children(st: Storage, dirs: set[str]):
    """Run layouts recognised by what their checkpoint children hold (Orbax: numeric step dirs)."""
    for lay in sorted(spec.run_layouts(), key=lambda l: -l.priority):
        if not lay.child_files:
            continue
        kids = sorted((d for d in dirs if lay.steps.matches(d)), reverse=True)[:3]
        for d in kids:
            try:
                names = {e.name for e in st.listdir(d)}
            except OSError:
                continue
            if any(spec.match_any(n, lay.child_files) for n in names):
                return lay
    return None


def _by_local_files(st: Storage, dirs: set[str]):
    """A root of node-local per-rank directories (a family with `local` patterns, e.g. NVRx):
    its checkpoint layout, when a rank directory holds one of its files."""
    import re
    for fam in spec.families().values():
        if not fam.local or not fam.checkpoints:
            continue
        dirty = fam.local.get("dirty")
        for d in sorted(x for x in dirs if re.fullmatch(fam.local["rank_dir"], x))[:16]:
            try:
                names = [e.name for e in st.listdir(d)]
            except OSError:
                continue
            if any(re.fullmatch(fam.local["file"], n) or (dirty and re.fullmatch(dirty, n)) for n in names):
                return fam.checkpoints[0]
    return None


def _checkpoint(st: Storage, name: str, among: tuple[str, ...], step, run) -> CheckpointView:
    probe = CheckpointView(st, name, spec.get(among[0]) if among else None, step, run)
    probe._decide = functools.partial(_detect, among)   # from its listing, when first asked
    return probe


def _detect(among: tuple[str, ...], view: CheckpointView):
    try:
        files, dirs = set(view.files), set(view.dirs)
    except OSError:
        files, dirs = set(), set()
    return spec.detect("checkpoint", files, dirs, among=among, name=view.name)


def _file_checkpoint(st: Storage, name: str, among: tuple[str, ...], step, run) -> CheckpointView:
    """A checkpoint that is one file of the run root (Composer's `ep0-ba4-rank0.pt`): a view of the
    root that holds only that entry, so every check reads it as a checkpoint of one file."""
    view = CheckpointView(st, "", spec.get(among[0]) if among else None, step, run)
    view.only, view.name, view.display = name, name, st.show(name)
    if name in run.entries:   # the root's listing, not one more listing per checkpoint
        view.__dict__["entries"] = {name: run.entries[name]}
    return view


def checkpoint_in_run(st: Storage, name: str, run_layout: spec.Layout | None) -> CheckpointView | None:
    """Directory `name` under `st` judged as the run layout that will hold it (a publish's staging
    judged as the destination run root will see it: an iter_NNNNNNN directory beside a Megatron
    tracker is a Megatron checkpoint, whose commit marker a plain DCP save lacks)."""
    if run_layout is None or run_layout.scope != "run" or not run_layout.checkpoint_layouts:
        return locate(st.sub(name)).checkpoint
    return _checkpoint(st, name, run_layout.checkpoint_layouts, run_layout.steps.step(name), None)
