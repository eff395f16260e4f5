"""`ckptdoctor prune RUN_ROOT --keep-last K [--keep-every M] [--keep-within 7d] [--dry-run]`: the retention publish
uses, on its own.  Never removed: the tracker's target, the checkpoint the framework resumes from,
the newest complete checkpoint, and anything still being written (a staging sibling exists).
Removal renames to a trash name first, then deletes; `--dry-run` only prints the plan."""
from __future__ import annotations

from ..engine.errors import UsageError
from ..engine.runner import Engine
from ..publishing import retention
from . import verify as vflow


def run(location: str, engine: Engine, *, keep_last: int | None, keep_every: int | None, dry_run: bool,
        keep_within: str | None = None) -> dict:
    if keep_last is None and not keep_every and keep_within is None:
        raise UsageError("prune needs a policy: --keep-last K, --keep-every M and/or --keep-within DURATION")
    within = None
    if keep_within is not None:
        try:
            within = retention.parse_duration(keep_within)
        except ValueError as exc:
            raise UsageError(f"--keep-within {exc}") from None
    if keep_last is not None and keep_last < 1:
        raise UsageError("--keep-last must be at least 1")
    if keep_every is not None and keep_every < 1:
        raise UsageError("--keep-every must be at least 1")
    import contextlib
    if not dry_run:
        _refuse_unless_a_run_root(location)
    dest = _dest(location)
    # judged under the lock it deletes under (a dry run writes nothing, not even the lock): a publish
    # or `verify --fix` that moves the tracker meanwhile is waited for, and what it names is protected
    with (contextlib.nullcontext() if dry_run else dest.lock()):
        rep, runv = vflow.judge(location, engine)
        if runv is None or rep.facts.get("kind") != "run":
            raise UsageError(f"{location}: prune works on a run root (a directory of checkpoints)")
        entries = dest.entries()
        protect: dict[str, str] = {}
        named = runv.tracker.target
        if named:
            protect[named] = "the tracker names it"
        if runv.resume_target:
            protect.setdefault(runv.resume_target, "the framework resumes from it")
        newest = runv.newest_complete()
        if newest:
            protect.setdefault(newest.name, "the newest complete checkpoint")
        rows = {r["name"]: r for r in rep.facts.get("checkpoints") or []}
        p = retention.plan(entries, runv.layout, keep_last=keep_last, keep_every=keep_every, protect=protect,
                           real_dir=dest.real_dir, keep_within=within,
                           ages={n: r.get("age_seconds") for n, r in rows.items()})
        if not dry_run:
            dest.prune(p.removed)
    freed = sum(rows[n].get("bytes") or 0 for n in p.removed if n in rows)
    out = {"dry_run": dry_run, "removed": p.removed, "kept": p.kept, "bytes": freed}
    rep.facts["pruned"] = out
    return out


def _refuse_unless_a_run_root(location: str) -> None:
    """Refused before the lock is taken: taking it writes `.ckptdoctor-lock` into the directory named,
    and a single checkpoint must come out of a refused prune exactly as it went in.  One listing, no
    judgement (the judgement under the lock checks it again).  A single checkpoint is refused, and so
    is a directory of no known layout (empty, or unrelated files): neither is a run root."""
    from ..io.fs import open_location
    from ..layouts.locate import locate
    try:
        found = locate(open_location(location))
    except (OSError, ValueError):
        return   # the judgement under the lock reports what cannot be read, in its own words
    if found.kind != "run":
        raise UsageError(f"{location}: prune works on a run root (a directory of checkpoints)")


def _dest(location: str):
    from ..io.fs import open_location
    from ..publishing.dest import LocalDest, ObjectDest
    st = open_location(location)
    if st.local:
        return LocalDest(st.abspath(""))
    return ObjectDest(st.fs, st.root, st.display)
