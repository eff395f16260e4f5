"""reconcile: does an RL run resume on the same data?  One function per invariant (notes §5.3).

Subject: a `ReconcileView` (run state + the positions N, L, T, C, A, cnt(t)).  Every finding
quotes the file and key its evidence came from (`details.evidence`).
"""
from __future__ import annotations

from ..engine.finding import Hit
from ..engine.registry import check


def _ev(v, *fields) -> dict:
    return {f: v.rs.where(f) for f in fields}


def _at(v, field) -> str:
    """Finding path: the file behind `field` when known, else the checkpoint."""
    return v.path_of(field)


def _ids(ids) -> str:
    if not ids:
        return "none"
    if all(isinstance(i, int) for i in ids) and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"p{ids[0]}-p{ids[-1]}" if len(ids) > 1 else f"p{ids[0]}"
    return ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")


@check("CKD301", "reconcile")
def cursor_behind_buffer(v, eng):
    """R1: the newest restored target must not lie beyond the cursor."""
    p = v.pos
    mt = p.max_target
    if mt is None:
        return
    if p.c is None:
        yield Hit(_at(v, "buffer.groups"), f"replay buffer holds groups for step {mt} but the sampler "
                  f"cursor is unknown: the resume cannot be proven safe",
                  severity="error", details={"max_target": mt, "evidence": _ev(v, "buffer.groups")},
                  hint="map the cursor with --map sampler.cursor=FILE:PATH, or save it with the checkpoint")
        return
    if mt <= p.c:
        return
    ahead = sorted(t for t in p.cnt if t > p.c)
    dropped = sum(min(p.cnt[t], p.n or p.cnt[t]) for t in ahead)
    base = (f"sampler cursor {p.c} is behind replay-buffer target step(s) {', '.join(map(str, ahead))} "
            f"({dropped} group(s)): on resume the rollout loop stamps those steps again and the "
            f"duplicate check drops {dropped} prompt(s) of the batch(es) it pulls")
    det = {"cursor": p.c, "targets_ahead": ahead, "dropped_prompts": dropped,
           "evidence": _ev(v, "sampler.cursor", "buffer.groups", "dataloader.batches_total")}
    if p.a is None:
        yield Hit(_at(v, "sampler.cursor"), base + "; the dataloader position is unknown, so whether "
                  "they are duplicates or lost cannot be decided", severity="error", details=det,
                  hint="map the dataloader position (train_dataloader.pt, or --map dataloader.batches_in_epoch=...)")
    elif p.a > p.c + 1:
        yield Hit(_at(v, "sampler.cursor"), base + f"; the dataloader is ahead (batches_total {p.a} > "
                  f"cursor+1 = {p.c + 1}), so they are fresh prompts and are LOST", severity="error",
                  details=det, hint="see CKD303 for the repair")
    else:
        where = ("agrees with the cursor" if p.a == p.c + 1 else
                 f"is behind the cursor (cursor+1 = {p.c + 1}; CKD303 counts what it re-yields)")
        yield Hit(_at(v, "sampler.cursor"), base + f"; the dataloader {where} (batches_total "
                  f"{p.a}), so the drop deduplicates the buffered groups by count (prompt identity is not "
                  f"recorded, so it cannot be checked)", severity="warning", details=det,
                  hint="do not raise the cursor to the buffer target: that would train a batch twice")


@check("CKD302", "reconcile")
def cursor_outside_window(v, eng):
    """R2: T-1 <= C <= T+L."""
    p = v.pos
    if None in (p.t, p.c, p.lookahead):
        return
    lo, hi = p.t - 1, p.t + p.lookahead
    if lo <= p.c <= hi:
        return
    why = ("the next stamps fall below the trainer version, so those groups are evicted at once and a "
           "batch is wasted per stamp" if p.c < lo else
           "the gate is already violated (was max_lookahead_versions lowered between runs?)")
    yield Hit(_at(v, "sampler.cursor"), f"sampler cursor {p.c} is outside the gate window [{lo}, {hi}] "
              f"(trainer version {p.t}, lookahead {p.lookahead}): {why}",
              details={"cursor": p.c, "window": [lo, hi],
                       "evidence": _ev(v, "sampler.cursor", "trainer.version", "config.max_lookahead_versions")},
              hint="restore the lookahead the run was saved with, or resume from a checkpoint whose "
                   "cursor lies in the window")


@check("CKD303", "reconcile")
def cursor_dataloader_mismatch(v, eng):
    """R3: batches admitted by the dataloader must equal cursor + 1."""
    p = v.pos
    if p.a is None or p.c is None:
        return
    if p.a == p.c + 1:
        return
    n = p.n   # None: num_prompts_per_step unknown, so the batches are counted but not their prompts

    def at_risk(k: int) -> int | None:
        return k * n if n is not None else None

    def prompts(k: int) -> str:
        return f"{k * n} prompt(s)" if n is not None else f"the prompts of {k} batch(es) (num_prompts_per_step unknown)"
    ev = _ev(v, "sampler.cursor", "dataloader.batches_in_epoch", "dataloader.batches_total")
    if p.a > p.c + 1:
        k = p.a - (p.c + 1)
        plan = v.plan
        fix = (f"safe repair available: `ckptdoctor reconcile --fix` sets the cursor to {plan.new_cursor} "
               f"(simulated: lost {len(plan.before.lost_prompts)} -> {len(plan.after.lost_prompts)}, no "
               f"duplicate, no stall)" if plan.safe else
               f"no automatic repair: {plan.reason}; the lost prompts need a dataloader rewind by hand "
               f"(only for map-style loaders with num_workers=0)")
        sim = plan.before or p.simulate(steps=v.steps)
        seen = (f" (simulated: lost on resume {_ids(sim.lost_prompts)}, lost at save {_ids(sim.lost_at_save)})"
                if sim else "")
        yield Hit(_at(v, "dataloader.batches_in_epoch"),
                  f"dataloader is {k} batch(es) ahead of the sampler cursor (batches_total {p.a}, cursor "
                  f"{p.c}): the next batch pulled ({p.a}) is stamped step {p.c + 1}, so {prompts(k)} "
                  f"are skipped and never trained{seen}",
                  severity="error", details={"cursor": p.c, "admitted": p.a,
                                             "prompts_at_risk": at_risk(k),
                                             "repair": plan.new_cursor, "evidence": ev}, hint=fix)
    else:
        k = (p.c + 1) - p.a
        yield Hit(_at(v, "dataloader.batches_in_epoch"),
                  f"dataloader is {k} batch(es) behind the sampler cursor (batches_total {p.a}, cursor "
                  f"{p.c}): re-yielded batches get new stamps and their buffered twins ({prompts(k)}) "
                  f"are trained twice", severity="warning",
                  details={"cursor": p.c, "admitted": p.a, "prompts_at_risk": at_risk(k),
                           "evidence": ev},
                  hint="no automatic repair (it would need the cursor lowered and the buffer trimmed); "
                       "accept the duplicates or resume from an earlier checkpoint")


@check("CKD304", "reconcile")
def step_not_fillable(v, eng):
    """R4: every step between the trainer version and the cursor holds exactly N groups."""
    p = v.pos
    if None in (p.t, p.c, p.n):
        return
    for t in range(p.t, p.c + 1):
        have = p.cnt.get(t, 0)
        if have < p.n:
            yield Hit(_at(v, "buffer.groups"), f"step {t} has {have} of {p.n} groups and no future admission "
                      f"stamps it (cursor {p.c}): the trainer waits forever at step {t}", severity="error",
                      details={"step": t, "have": have, "need": p.n,
                               "evidence": _ev(v, "buffer.groups", "sampler.cursor")},
                      hint=f"lowering the cursor to {t - 1} gap-fills but shifts every later stamp, costing "
                           f"{have} fresh prompt(s) and {p.n - have} original(s); decide by hand")
        elif have > p.n:
            yield Hit(_at(v, "buffer.groups"), f"step {t} has {have} groups for {p.n} slots: {have - p.n} "
                      f"will be evicted as waste", severity="warning",
                      details={"step": t, "have": have, "need": p.n, "evidence": _ev(v, "buffer.groups")})


@check("CKD305", "reconcile")
def target_outside_window(v, eng):
    """R5: restored targets lie in [T, T+L] and are contiguous from T."""
    p = v.pos
    if p.t is None or not p.cnt:
        return
    old = sorted(t for t in p.cnt if t < p.t)
    if old:
        k = sum(p.cnt[t] for t in old)
        yield Hit(_at(v, "buffer.groups"), f"{k} restored group(s) target step(s) {old} below the trainer "
                  f"version {p.t}: the first evict discards them and their prompts are gone",
                  severity="warning", details={"targets": old, "groups": k,
                                               "evidence": _ev(v, "buffer.groups", "trainer.version")})
    if p.lookahead is not None:
        far = sorted(t for t in p.cnt if t > p.t + p.lookahead)
        if far:
            yield Hit(_at(v, "buffer.groups"), f"restored target step(s) {far} lie beyond the gate window "
                      f"(trainer {p.t} + lookahead {p.lookahead})", severity="error",
                      details={"targets": far, "evidence": _ev(v, "buffer.groups", "config.max_lookahead_versions")})
    live = sorted(t for t in p.cnt if t >= p.t)
    gaps = [t for t in range(p.t, live[-1] + 1) if t not in p.cnt] if live else []
    if gaps:
        yield Hit(_at(v, "buffer.groups"), f"restored targets are not contiguous from step {p.t}: "
                  f"missing {gaps}", severity="warning",
                  details={"missing": gaps, "evidence": _ev(v, "buffer.groups")})


@check("CKD306", "reconcile")
def stale_groups(v, eng):
    """R6: windowed / weight_fifo samplers evict groups generated more than s versions ago."""
    p = v.pos
    s = v.rs.get("config.max_staleness_versions")
    sampler = v.rs.get("config.sampler")
    if p.t is None or s is None or sampler not in ("windowed", "weight_fifo"):
        return
    stale = [g for g in v.rs.groups if g.get("start_version") is not None and g["start_version"] < p.t - s]
    if stale:
        yield Hit(_at(v, "buffer.groups"), f"{len(stale)} buffered group(s) were generated before version "
                  f"{p.t - s} (trainer {p.t}, max staleness {s}): they are evicted on resume and their "
                  f"prompts are not re-yielded", details={"groups": len(stale),
                                                          "evidence": _ev(v, "buffer.groups", "config.max_staleness_versions")})


@check("CKD307", "reconcile")
def reserve_unaccounted(v, eng):
    """R7: prompts pulled but neither admitted nor pooled."""
    p = v.pos
    res = v.rs.get("reserve.prompts")
    mode = v.rs.get("config.on_dropped_prompt") or "shrink"
    bt = v.rs.get("dataloader.batches_total")
    if res is None:
        return
    if mode != "replace" and res > 0:
        yield Hit(_at(v, "reserve.prompts"), f"{res} prompt(s) sit in the replacement reserve although "
                  f"on_dropped_prompt is {mode!r}: nothing will consume them", severity="error",
                  details={"reserve": res, "mode": mode, "evidence": _ev(v, "reserve.prompts", "config.on_dropped_prompt")})
    elif mode == "replace" and None not in (bt, p.c, p.n) and res > (bt - (p.c + 1)) * p.n:
        yield Hit(_at(v, "reserve.prompts"), f"replacement reserve holds {res} prompt(s), more than the "
                  f"{(bt - (p.c + 1)) * p.n} the dataloader pulled beyond the cursor", severity="warning",
                  details={"reserve": res, "evidence": _ev(v, "reserve.prompts", "dataloader.batches_total")})


@check("CKD308", "reconcile")
def torn_capture(v, eng):
    """R8: the data plane and the replay file describe the same cut."""
    rs = v.rs
    d1, d2 = rs.get("data_plane.manifest_digest"), rs.get("buffer.manifest_digest")
    if d1 is not None and d2 is not None and d1 != d2:
        yield Hit(_at(v, "data_plane.manifest_digest"), f"data-plane manifest digest {d1[:16]} differs from "
                  f"the replay file's {d2[:16]}: NeMo-RL refuses this resume", severity="error",
                  details={"evidence": _ev(v, "data_plane.manifest_digest", "buffer.manifest_digest")})
    gc = rs.get("data_plane.group_count")
    if gc is not None and rs.get("buffer.groups") is not None and gc != len(rs.groups):
        yield Hit(_at(v, "data_plane.group_count"), f"data plane records {gc} replay group(s), the replay "
                  f"file holds {len(rs.groups)}", severity="error",
                  details={"data_plane": gc, "replay": len(rs.groups),
                           "evidence": _ev(v, "data_plane.group_count", "buffer.groups")})
    p = v.pos
    if rs.get("capture.buffer_with_cursor") is False and p.max_target is not None and p.c is not None \
            and p.max_target > p.c:
        yield Hit(_at(v, "buffer.groups"), "the replay buffer was captured after the cursor (separate "
                  "awaits in the save path): the buffer ran ahead of the saved cursor in between",
                  severity="info", details={"capture": {"buffer_with_cursor": False}})


@check("CKD309", "reconcile")
def trainer_fields_disagree(v, eng):
    """R9: the checkpoint's anchors agree (directory, training_info, data-plane metadata)."""
    rs = v.rs
    step = rs.get("trainer.step")
    pairs = [("run.checkpoint_step", step, "trainer.step"),
             ("data_plane.train_steps", step, "trainer.step"),
             ("data_plane.trainer_version", rs.get("trainer.version"), "trainer.version"),
             ("data_plane.epoch", rs.get("trainer.epoch"), "trainer.epoch"),
             ("data_plane.sampler_name", rs.get("sampler.name"), "sampler.name")]
    for fld, want, other in pairs:
        got = rs.get(fld)
        if got is not None and want is not None and got != want:
            yield Hit(_at(v, other), f"{fld} = {got!r} but {other} = {want!r}: weights and data state "
                      f"disagree about where the run is", details={"evidence": _ev(v, fld, other)},
                      hint="resume from a checkpoint whose files were written in one save")
    n, cons = rs.get("config.num_prompts_per_step"), rs.get("trainer.consumed_prompts")
    if None not in (n, cons, step) and cons > n * step:
        yield Hit(_at(v, "trainer.consumed_prompts"), f"consumed_prompts {cons} exceeds "
                  f"num_prompts_per_step x step = {n * step}",
                  details={"evidence": _ev(v, "trainer.consumed_prompts", "trainer.step")})


@check("CKD310", "reconcile")
def epoch_boundary(v, eng):
    """R10: a dataloader saved exactly at the end of an epoch."""
    rs = v.rs
    bie, bpe = rs.get("dataloader.batches_in_epoch"), rs.get("config.batches_per_epoch")
    fin = rs.get("dataloader.iterator_finished")
    if fin:
        yield Hit(_at(v, "dataloader.iterator_finished"), "the dataloader was saved after its epoch ended: "
                  "the resume starts the next epoch directly", severity="info",
                  details={"evidence": _ev(v, "dataloader.iterator_finished")})
    elif bie is not None and bpe is not None and bie == bpe:
        yield Hit(_at(v, "dataloader.batches_in_epoch"), f"dataloader saved at the end of its epoch "
                  f"({bie}/{bpe} batches) without StopIteration: the first iter() after resume yields 0 "
                  f"batches and the epoch counter may advance twice (verl PR 5725)", severity="warning",
                  details={"evidence": _ev(v, "dataloader.batches_in_epoch", "config.batches_per_epoch")})


@check("CKD311", "reconcile")
def latest_pointer(v, eng):
    """R11: the latest-status file names an existing step; no staging leftovers."""
    rs = v.rs
    steps = rs.get("run.steps")
    ls = rs.get("run.latest_status_step")
    if ls is not None and steps is not None and ls not in steps:
        yield Hit(_at(v, "run.latest_status_step"), f"latest checkpoint status names step {ls}, which does "
                  f"not exist as a finished step directory (have {steps[-3:] if steps else 'none'}): the "
                  f"status is written before the background rename", details={"evidence": _ev(v, "run.latest_status_step")},
                  hint="resume from the newest existing step; do not trust the status file for it")
    for name in rs.get("run.staging") or []:
        yield Hit(v.parent_show(name), f"staging leftover {name}: a save or swap was interrupted",
                  details={"dir": name}, hint="never resume from it; delete it once the run is stopped")


@check("CKD312", "reconcile")
def sampler_config_mismatch(v, eng):
    """R12: saved sampler name and group sizes agree with the config."""
    rs = v.rs
    saved, cfg = rs.get("sampler.name"), rs.get("config.sampler")
    if saved is not None and cfg is not None and saved != cfg:
        yield Hit(_at(v, "sampler.name"), f"checkpoint was saved with sampler {saved!r}, the config says "
                  f"{cfg!r}: NeMo-RL main skips the buffer restore (the buffered groups are lost), later "
                  f"versions refuse to resume", severity="error",
                  details={"evidence": _ev(v, "sampler.name", "config.sampler")})
    gs = rs.get("config.group_size")
    if gs is not None:
        bad = [g for g in rs.groups if g.get("size") is not None and g["size"] != gs]
        if bad:
            yield Hit(_at(v, "buffer.groups"), f"{len(bad)} buffered group(s) have a size other than the "
                      f"configured group size {gs} (e.g. {bad[0]['size']})", severity="error",
                      details={"groups": len(bad), "evidence": _ev(v, "buffer.groups", "config.group_size")})


@check("CKD313", "reconcile")
def run_state_unreadable(v, eng):
    for note in v.rs.notes:
        path, _, msg = note.partition(": ")
        yield Hit(path if msg else v.display, msg or note,
                  hint="the fields this file provides are treated as unknown")


@check("CKD314", "reconcile")
def positions_unknown(v, eng):
    p = v.pos
    names = {"config.num_prompts_per_step": p.n, "config.max_lookahead_versions": p.lookahead,
             "trainer.version": p.t, "sampler.cursor": p.c, "dataloader.batches_total": p.a}
    missing = [k for k, val in names.items() if val is None]
    if missing:
        yield Hit(v.display, f"unknown: {', '.join(missing)}; the rules and the simulator that need them "
                  f"were not decided", details={"unknown": missing},
                  hint="map them with --map FIELD=FILE:PATH or fill them in a run_state/v1 file")
