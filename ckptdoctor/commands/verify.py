"""verify: structural (and with --checksums, content) checks of a checkpoint or run root."""
from __future__ import annotations


from ..engine.finding import Report
from ..engine.runner import Engine
from ..io.fs import Storage, open_location
from ..layouts import spec
from ..layouts.model import CheckpointStatus, CheckpointView, RunView, age_seconds
from ..engine.finding import Hit

STRUCTURAL_SCOPES = ("checkpoint",)


def build(st: Storage, layout_name: str | None):
    """Decide what the location is: ('run', RunView) or ('checkpoint', CheckpointView) or None."""
    entries = {e.name: e for e in st.listdir("")}
    files = {n for n, e in entries.items() if not e.is_dir}
    dirs = {n for n, e in entries.items() if e.is_dir}
    forced = spec.get(layout_name) if layout_name else None
    run_layout = forced if forced and forced.scope == "run" else None
    if run_layout is None and forced is None:
        run_layout = spec.detect("run", files, dirs) or _by_children(st, dirs)
        # a directory that is itself a checkpoint is not a run root (e.g. Megatron iter dir)
        own = spec.detect("checkpoint", files, dirs, name=st.display.rstrip("/").rsplit("/", 1)[-1])
        if run_layout and own and own.priority >= run_layout.priority and not any(
                run_layout.dir_re and run_layout.dir_re.match(d) for d in dirs):
            run_layout = None
    if run_layout:
        run = RunView(st, run_layout, entries)
        for name in sorted(dirs):
            step = run.step_of(name)
            if step is None:
                continue
            run.checkpoints.append(_checkpoint(st, name, run_layout.checkpoint_layouts, step, run))
        run.checkpoints.sort(key=lambda c: (c.step if c.step is not None else -1, c.name))
        return "run", run
    ck_layout = forced or spec.detect("checkpoint", files, dirs, name=st.display.rstrip("/").rsplit("/", 1)[-1])
    if ck_layout is None:
        return None
    return "checkpoint", CheckpointView(st, "", ck_layout)


def _by_children(st: Storage, dirs: set[str]):
    """Run layouts recognised by what their checkpoint children hold (Orbax: numeric step dirs)."""
    for lay in sorted(spec.layouts().values(), key=lambda l: -l.priority):
        if lay.scope != "run" or not lay.child_files or not lay.dir_re:
            continue
        kids = sorted((d for d in dirs if lay.dir_re.match(d)), reverse=True)[:3]
        for d in kids:
            try:
                names = {e.name for e in st.listdir(d)}
            except OSError:
                continue
            if any(spec.match_any(n, lay.child_files) for n in names):
                return lay
    return None


def _checkpoint(st: Storage, name: str, among: tuple[str, ...], step, run) -> CheckpointView:
    probe = CheckpointView(st, name, spec.get(among[0]) if among else None, step, run)
    try:
        files = set(probe.files)
        dirs = set(probe.dirs)
    except OSError:
        files, dirs = set(), set()
    lay = spec.detect("checkpoint", files, dirs, among=among) or (spec.get(among[0]) if among else None)
    probe.layout = lay
    return probe


def check_checkpoint(engine: Engine, ck: CheckpointView) -> CheckpointStatus:
    status = CheckpointStatus(ck)
    try:
        ck.entries
    except OSError as exc:
        f = engine.emit("CKD901", Hit(path=ck.display, message=f"cannot list checkpoint directory: "
                                      f"{exc.strerror or exc}", details={"errno": exc.errno}))
        status.complete = False
        status.reasons.append("CKD901 unreadable")
        status.findings = 1 if f else 0
        return status
    added = engine.run_scope("checkpoint", ck)
    status.findings = len(added)
    for f in added:
        if f.severity == "error":
            status.complete = False
            status.reasons.append(f"{f.rule} {f.name}")
    return status


def run(location: str, engine: Engine, layout: str | None = None) -> Report:
    st = open_location(location)
    rep = engine.report
    what = build(st, layout)
    if what is None:
        engine.emit("CKD902", Hit(path=st.display, message="no known checkpoint layout here (no marker, "
                                  "shard, tracker or checkpoint directory recognised)",
                                  hint="point at a checkpoint directory or run root, or pass --layout "
                                       "(see `ckptdoctor layouts`)"))
        return rep
    kind, view = what
    if engine.opt("slice"):
        k, n = engine.opt("slice")
        rep.facts["slice"] = {"k": k, "n": n, "units": 0, "bytes": 0}
    rep.facts["kind"] = kind
    rep.facts["layout"] = view.layout.name
    if kind == "checkpoint":
        status = check_checkpoint(engine, view)
        rep.facts["checkpoints"] = [_row(status)]
        _slice_stats(engine, rep)
        return rep
    runv: RunView = view
    for ck in runv.checkpoints:
        runv.status[ck.name] = check_checkpoint(engine, ck)
    engine.run_scope("run", runv)
    newest = runv.newest_complete()
    rep.facts["checkpoints"] = [_row(runv.status[c.name]) for c in runv.checkpoints]
    rep.facts["newest_complete"] = newest.name if newest else None
    rep.facts["resume_from"] = runv.resume_target
    _slice_stats(engine, rep)
    for f in rep.findings:  # tell users of a broken checkpoint what to use instead
        if f.severity == "error" and newest and f.path.startswith(st.show("")) and newest.display not in f.path:
            if f.rule in ("CKD101", "CKD102") and not (f.hint or "").endswith("."):
                f.hint = (f.hint + "; " if f.hint else "") + f"newest complete checkpoint: {newest.name}."
    return rep


def _slice_stats(engine, rep):
    sl = rep.facts.get("slice")
    if sl is not None:
        for res in engine.cache.get("content", {}).values():
            sl["units"] += res.units
            sl["bytes"] += res.bytes


def _row(s: CheckpointStatus) -> dict:
    c = s.view
    try:
        size = c.total_bytes
        mtime = c.newest_mtime
    except OSError:
        size, mtime = None, None
    age = age_seconds(mtime)
    return {"name": c.name, "step": c.step, "layout": c.layout.name if c.layout else None,
            "complete": s.complete, "why": s.reasons, "bytes": size,
            "age_seconds": round(age, 1) if age is not None else None, "findings": s.findings}
