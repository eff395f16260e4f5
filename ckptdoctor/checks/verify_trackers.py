"""Run-root trackers: the file that decides what the framework resumes from."""
from __future__ import annotations

from ..engine.finding import Hit
from ..engine.registry import check
from ..layouts.trackers import render


@check("CKD111", "run")
def tracker_missing(run, eng):
    t = run.tracker
    spec = t.spec
    if spec is None or t.entry is not None or spec.monitoring:
        return
    done = run.newest_complete()
    if done:
        yield Hit(run.storage.show(spec.file),
                  f"tracker {spec.file} is missing while complete checkpoints exist "
                  f"(newest {done.name}): the framework will silently start from step 0",
                  details={"tracker": spec.file, "newest_complete": done.name},
                  hint=(f"`ckptdoctor verify --fix {run.storage.show('')}` links it to {done.name} (or "
                        f"`ln -s {done.name} {spec.file}` in the run root)") if spec.parse == "symlink" else
                       f"write the tracker atomically: ckptdoctor publish, or write "
                       f"{_content(run.layout, done.name)} into {spec.file} (temp file + rename)")


def _content(layout, name: str) -> str:
    """What the framework's writer puts in the tracker for `name`, quoted for the hint (a DeepSpeed
    `latest` holds the tag itself, a Megatron one the step); the step of it when no writer is known."""
    try:
        return repr(render(layout, name))
    except ValueError:
        return f"the step of {name}"


@check("CKD112", "run")
def tracker_unparsable(run, eng):
    spec, val = run.tracker.spec, run.tracker.value
    if val is not None and val.problem:
        yield Hit(run.storage.show(spec.file), f"{spec.file}: {val.problem}",
                  severity="warning" if spec.monitoring else None,
                  details={"tracker": spec.file, "content": val.raw[:80]},
                  hint=f"the framework cannot resume from it; replace it with a relative link to a complete "
                       f"checkpoint (`ckptdoctor verify --fix {run.storage.show('')}` once it is moved aside)"
                  if spec.parse == "symlink" else
                       "the framework cannot read it (Megatron even exits 0); rewrite it to name a "
                       "complete checkpoint")


@check("CKD113", "run")
def tracker_dangling(run, eng):
    spec, val = run.tracker.spec, run.tracker.value
    if val is None or val.problem or val.target is None:
        return
    names = {c.name: c for c in run.checkpoints}
    done = run.newest_complete()
    instead = f"; newest complete checkpoint is {done.name}" if done else "; no complete checkpoint exists"
    if spec.monitoring:  # a status file the framework does not resume from
        if val.target not in names:
            yield Hit(run.storage.show(spec.file), f"{spec.file} names {val.target}, which does not exist "
                      f"(it is written before the background rename finishes); the framework resumes from "
                      f"{run.resume_target or 'nothing'}", severity="warning",
                      details={"tracker": spec.file, "target": val.target, "monitoring": True},
                      hint="do not trust the status file for the resume step; check the save that died")
        return
    if val.target not in names:
        yield Hit(run.storage.show(spec.file), f"tracker names {val.target}, which does not exist"
                                                  + instead,
                  details={"tracker": spec.file, "target": val.target,
                           "newest_complete": done.name if done else None},
                  hint=(f"`ckptdoctor verify --fix {run.storage.show('')}` repoints it at {done.name} (add --dry-run to see "
                        f"how first)") if done else None)
    elif not run.status[val.target].complete:
        st = run.status[val.target]
        yield Hit(run.storage.show(spec.file), f"tracker names {val.target}, which is incomplete "
                                                  f"({', '.join(st.reasons[:3])})" + instead,
                  details={"tracker": spec.file, "target": val.target, "why": st.reasons,
                           "newest_complete": done.name if done else None},
                  hint=(f"`ckptdoctor verify --fix {run.storage.show('')}` repoints it at {done.name} (add --dry-run to see "
                        f"how first)") if done else None)


@check("CKD114", "run")
def tracker_behind(run, eng):
    spec, val = run.tracker.spec, run.tracker.value
    if val is None or val.problem or val.target is None or spec.monitoring:
        return
    by_name = {c.name: c for c in run.checkpoints}
    cur = by_name.get(val.target)
    done = run.newest_complete()
    if cur is not None and done is not None and cur.step is not None and done.step > cur.step:
        yield Hit(run.storage.show(spec.file),
                  f"tracker names {cur.name} but {done.name} is newer and complete",
                  details={"tracker": spec.file, "target": cur.name, "newest_complete": done.name},
                  hint=f"the run will redo {done.step - cur.step} steps; repoint the tracker if "
                       f"{done.name} is the one you want")


@check("CKD135", "run")
def newer_save_blocks_resume(run, eng):
    """Composer: a step file later than the resume target (by every field the family names in
    `extra.refuses_newer`, e.g. epoch and batch) makes training refuse to start."""
    rule = run.layout.extra.get("refuses_newer")
    target = run.resume_target
    if not rule or target is None:
        return
    fields = run.layout.steps.fields(target)
    shown = target
    if fields is None:   # a link copied as a file (cp -L, rsync -L, an object store): the step it copies
        same = _copied_step(run, target)
        if same is None:
            return       # matches no step file: which step it holds is unknown here, nothing to compare
        fields, shown = run.layout.steps.fields(same), f"{target} (a copy of {same})"
        target = same
    for c in run.checkpoints:
        theirs = run.layout.steps.fields(c.name) if c.name != target else None
        later = [k for k in rule["fields"] if theirs and k in theirs and k in fields and int(theirs[k]) > int(fields[k])]
        if later:
            say = rule.get("labels", {})
            yield Hit(c.display, f"{c.name} ({', '.join(f'{say.get(k, k)} {theirs[k]}' for k in later)}) is newer than the "
                                 f"resume target {shown}: {rule['raises']}",
                      details={"target": run.resume_target, "newer": c.name, "fields": later},
                      hint=f"move {c.name} out of {run.storage.show('')} (or to a name starting with '.') once "
                           f"inspected, or relaunch with {rule['unless']} if overwriting it is intended")


def _copied_step(run, copy: str) -> str | None:
    """The step file a regular-file tracker is a byte copy of, told by size and the zip directory's
    CRCs (a few kilobytes read per candidate of the same size, never the data): the framework loads
    the copy and resumes at that step.  Measured with Composer 0.32.1 (tests/fixtures/real/composer:
    copied-link-*): a copy of ep0-ba4 beside a killed ep0-ba6 raises as the link would."""
    mine = _fingerprint(run, copy)
    if mine is None:
        return None
    found = [c.name for c in run.checkpoints
             if c.name != copy and run.layout.steps.fields(c.name) is not None
             and getattr(run.entries.get(c.name), "size", None) == mine[0] and _fingerprint(run, c.name) == mine]
    return found[0] if len(found) == 1 else None


def _fingerprint(run, name: str) -> tuple | None:
    from ..layouts import ptzip
    e = run.entries.get(name)
    if e is None or not e.is_file or e.is_link:   # only regular files are opened
        return None
    try:
        with run.storage.open(name) as fh:
            return ptzip.fingerprint(fh)
    except OSError:
        return None
