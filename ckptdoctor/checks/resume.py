"""Resume proofs and the run contract (5xx): a checkpoint's per-rank digest set is complete
(verify), two digest sets agree (`digests diff`), and the run contract still holds (`contract
check`, preflight)."""
from __future__ import annotations

import re

from ..engine.finding import Hit
from ..engine.registry import check

RANK_FILE = re.compile(r"^rank_(\d{5,})\.json$")
MAX_SHOWN = 5


def _names(items: list[str]) -> str:
    return ", ".join(items[:MAX_SHOWN]) + (f" and {len(items) - MAX_SHOWN} more" if len(items) > MAX_SHOWN else "")


@check("CKD501", "checkpoint")
def digest_set_incomplete(ck, eng):
    """A checkpoint that carries ckptdoctor.digests/ must carry one readable file per rank."""
    if "ckptdoctor.digests" not in ck.dirs:  # (resume.DIR; not imported on every verify: start-up)
        return
    from .. import resume
    rel = ck.relpath(resume.DIR)
    entries = {e.name: e for e in ck.storage.listdir(rel)}
    sets, bad = {}, []
    for name, e in sorted(entries.items()):
        m = RANK_FILE.match(name)
        if not m or e.is_dir:
            continue
        try:
            ds = resume.parse(ck.storage.read(ck.storage.join(rel, name), resume.MAX_DIGEST_FILE), name)
            if ds.rank != int(m.group(1)):
                raise ValueError(f"{name}: says rank {ds.rank}")
            sets[ds.rank] = ds
        except (OSError, ValueError) as exc:
            bad.append((name, str(exc)))
    for name, why in bad:
        yield Hit(ck.path(f"{resume.DIR}/{name}"), f"{resume.DIR}/{name} is unreadable: {why}",
                  details={"file": f"{resume.DIR}/{name}", "why": why},
                  hint="this rank's save-time digests are lost: its restore cannot be proven")
    worlds = sorted({s.world_size for s in sets.values()})
    if len(worlds) > 1:
        yield Hit(ck.path(resume.DIR), f"{resume.DIR}: rank files disagree on the world size ({worlds}): "
                                       f"digests from different saves are mixed", details={"world_sizes": worlds})
        return
    if not worlds and not bad:
        yield Hit(ck.path(resume.DIR), f"{resume.DIR} holds no rank digest file", details={"missing": []})
        return
    world = worlds[0] if worlds else None
    if world is None:
        return
    unreadable = {int(RANK_FILE.match(n).group(1)) for n, _ in bad}
    missing = [f"rank_{r:05d}.json" for r in range(world) if r not in sets and r not in unreadable]
    if missing:
        yield Hit(ck.path(resume.DIR), f"{resume.DIR}: {len(missing)} of {world} rank digest file(s) missing: "
                                       f"{_names(missing)}", details={"missing": missing, "world_size": world},
                  hint="those ranks did not record (crashed, or record() is not called on every rank)")


# ---- digests diff ---------------------------------------------------------------------------------
@check("CKD502", "digests")
def digests_differ(diff, eng):
    for rank, (differing, missing, unexpected, detail) in sorted(diff.by_rank.items()):
        if not (differing or missing or unexpected):
            continue
        parts = []
        if differing:
            parts.append(f"{len(differing)} differ: " + _names([f"{i} ({detail[i]})" for i in differing]))
        if missing:
            parts.append(f"{len(missing)} only in {diff.a}: {_names(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} only in {diff.b}: {_names(unexpected)}")
        yield Hit(diff.b, f"rank {rank}: " + "; ".join(parts),
                  details={"rank": rank, "differing": differing, "only_in_a": missing, "only_in_b": unexpected})
    for rank, where in sorted(diff.ranks_missing.items()):
        yield Hit(diff.b, f"rank {rank} has digests only in {where}", details={"rank": rank, "only_in": where})


# ---- the run contract -----------------------------------------------------------------------------
@check("CKD510", "contract")
def contract_unreadable(sub, eng):
    if sub.error:
        yield Hit(sub.path, sub.error, hint="restore the contract from a copy; it is never rewritten by hand")


def _changes(sub, kind: str):
    for c in sub.changes(kind):
        what = {"changed": "changed", "added": "was added", "removed": "was removed"}[c.change]
        msg = f"{c.item} {what} since contract phase {sub.phase_index} ({sub.phase_reason})"
        if c.kind == "recipe" and c.files:   # the diff itself, not two hashes
            msg += ": " + "; ".join(c.files[:4]) + (f" (+{len(c.files) - 4} more lines)" if len(c.files) > 4 else "")
        elif c.files:
            msg += f": {len(c.files)} file(s) differ: " + ", ".join(c.files[:5]) + (" ..." if len(c.files) > 5 else "")
        elif c.was and c.now:
            msg += f": was {c.was}, now {c.now}"
        yield Hit(c.item if c.kind != "total_steps" else sub.path, msg,
                  details={"item": c.item, "change": c.change, "was": c.was, "now": c.now,
                           "phase": sub.phase_index, **({"diff" if c.kind == "recipe" else "files": list(c.files)}
                                                        if c.files else {})},
                  hint="put it back, or declare the change: ckptdoctor contract new-phase RUN_ROOT --reason ...")


@check("CKD511", "contract")
def contract_code_changed(sub, eng):
    yield from _changes(sub, "code")


@check("CKD512", "contract")
def contract_data_changed(sub, eng):
    yield from _changes(sub, "data")


@check("CKD513", "contract")
def contract_recipe_changed(sub, eng):
    yield from _changes(sub, "recipe")


@check("CKD514", "contract")
def contract_length_changed(sub, eng):
    yield from _changes(sub, "total_steps")
