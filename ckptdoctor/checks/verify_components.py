"""Per-family completeness beyond markers: required files, rank sets, staging leftovers."""
from __future__ import annotations

import re

from ..engine.finding import Hit
from ..engine.registry import check
from ..layouts.model import age_seconds
from ..layouts.spec import match_any


@check("CKD123", "checkpoint")
def required_component_missing(ck, eng):
    lay = ck.layout
    names = set(ck.entries)
    for req in lay.required:
        if not any(match_any(n, (req,)) for n in names):
            yield Hit(ck.path(req), f"{req} is missing ({lay.title})", details={"file": req},
                      hint=_why_required(lay.name, req))
    opt = tuple(lay.extra.get("optimizer_files", ()))
    if opt and ck.run is not None and not any(n in names for n in opt):
        peers = [c.name for c in ck.run.checkpoints if c is not ck and c.layout is lay
                 and any(f in c.files for f in opt)]
        if peers:
            yield Hit(ck.display, f"no optimizer state ({', '.join(opt)}) although {peers[-1]} has it: "
                      f"resuming here restarts the optimizer", severity="warning",
                      details={"missing": list(opt), "peer": peers[-1]})


def _why_required(layout: str, name: str) -> str:
    return {("verl", "data.pt"): "without it verl restarts the dataloader from sample 0 while the step "
                                 "resumes (prompts repeat); rotation deleting actor/ leaves such dirs too",
            ("hf-trainer", "trainer_state.json"): "Trainer cannot restore global_step or the RNG/LR state",
            }.get((layout, name), "the framework cannot resume without it")


@check("CKD122", "checkpoint")
def rank_set_incomplete(ck, eng):
    lay = ck.layout
    if lay.reader == "deepspeed":
        yield from _deepspeed(ck, lay)
    elif lay.reader == "verl":
        yield from _verl(ck, lay)


def _deepspeed(ck, lay):
    grid_re, model_re = re.compile(lay.extra["grid"]), re.compile(lay.extra["model"])
    grid: dict[int, set[int]] = {}
    models = set()
    for n, e in ck.files.items():
        m = grid_re.match(n)
        if m:
            grid.setdefault(int(m.group("mp")), set()).add(int(m.group("dp")))
        mm = model_re.match(n)
        if mm:
            models.add(int(mm.group("mp")))
        if (m or mm) and e.size == 0:
            yield Hit(ck.path(n), f"{n} is empty (0 bytes): a rank's save did not happen",
                      details={"file": n})
    if not grid:
        return
    want = max(max(s) for s in grid.values()) + 1
    for mp in sorted(set(grid) | models):
        have = grid.get(mp, set())
        missing = sorted(set(range(want)) - have)
        if missing:
            yield Hit(ck.display, f"model-parallel rank {mp}: ZeRO optimizer files of data-parallel rank(s) "
                      f"{_list(missing)} missing (have {len(have)} of {want})",
                      details={"mp": mp, "missing_dp": missing, "dp_world": want},
                      hint="zero_to_fp32 and load_checkpoint need every partition: copy the missing files "
                           "or resume from another tag")
    for mp in sorted(set(grid) - models):
        yield Hit(ck.path(f"mp_rank_{mp:02d}_model_states.pt"), f"mp_rank_{mp:02d}_model_states.pt is missing "
                  f"while its optimizer partitions exist", details={"mp": mp})


def _verl(ck, lay):
    rx = re.compile(lay.extra["rank_file"])
    for comp in lay.extra.get("components", ()):
        if comp not in ck.dirs:
            continue
        try:
            entries = ck.storage.listdir(ck.relpath(comp))
        except OSError:
            continue
        kinds: dict[str, dict[int, int]] = {}
        world = set()
        for e in entries:
            m = rx.match(e.name)
            if not m or e.is_dir:
                continue
            kinds.setdefault(m.group("kind"), {})[int(m.group("rank"))] = e.size
            world.add(int(m.group("world")))
            if e.size == 0:
                yield Hit(ck.path(f"{comp}/{e.name}"), f"{comp}/{e.name} is empty (0 bytes)",
                          details={"file": f"{comp}/{e.name}"})
        if len(world) > 1:
            yield Hit(ck.path(comp), f"{comp}/ mixes world sizes {sorted(world)}: files from two saves",
                      details={"component": comp, "world_sizes": sorted(world)})
            continue
        if not world:
            continue
        w = world.pop()
        for kind, ranks in sorted(kinds.items()):
            missing = sorted(set(range(w)) - set(ranks))
            if missing:
                yield Hit(ck.path(comp), f"{comp}/{kind}: rank(s) {_list(missing)} of world size {w} missing",
                          details={"component": comp, "kind": kind, "missing_ranks": missing, "world": w},
                          hint="every rank 0..W-1 loads its own file; copy the missing ones or resume earlier")


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:8])) + (f", ... ({len(xs)} in all)" if len(xs) > 8 else "")


@check("CKD124", "run")
def temp_leftover(run, eng):
    pats = run.layout.staging_globs
    if not pats:
        return
    target = run.resume_target
    named = run.tracker.target
    done = run.newest_complete()
    for name, e in sorted(run.entries.items()):
        if not e.is_dir or not match_any(name, pats):
            continue
        step = re.search(r"(\d+)", name)
        is_named = named is not None and step is not None and run.step_of(named) == int(step.group(1)) \
            and named not in {c.name for c in run.checkpoints}
        age = age_seconds(e.mtime)
        try:
            size = sum(x.size for x in run.storage.listdir(name) if not x.is_dir)
        except OSError:
            size = None
        sev = "error" if is_named else "warning"
        why = (f"the tracker names {named}, which exists only as this staging directory" if is_named else
               f"a save that is still staging or died; resume target {target or 'none'}"
               + (f", newest complete {done.name}" if done else ""))
        yield Hit(run.storage.show(name), f"staging leftover {name}: {why}", severity=sev,
                  details={"dir": name, "bytes": size, "age_seconds": round(age, 1) if age is not None else None},
                  hint="never resume from it; delete it once no process is writing it")
