"""reconcile: map an RL checkpoint (or read a run_state/v1 file), run the R-rules, simulate, repair."""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
from ..values import value
from functools import cached_property

import yaml

from ..engine.errors import InputError, UsageError
from ..engine.runner import Engine
from ..io.atomic import replace_file, write_new
from ..io.fs import LocalStorage, Storage, open_location
from ..io.decoded import load_yaml_bounded
from ..layouts.locate import locate
from ..runstate import profiles as prof
from ..runstate.positions import Positions, RepairPlan, plan_repair
from ..runstate.schema import RunState


@value
class ReconcileView:
    rs: RunState
    st: Storage            # the step directory, or the directory of the run-state file
    parent: Storage | None
    display: str
    state_file: str | None = None  # set when the input was a run_state/v1 file
    steps: int = 4

    @cached_property
    def pos(self) -> Positions:
        return Positions.of(self.rs)

    @cached_property
    def plan(self) -> RepairPlan:
        return plan_repair(self.pos, self.steps)

    def path_of(self, field: str) -> str:
        if self.state_file:
            return self.display
        src = self.rs.source(field)
        if src.kind != "file" or not src.file:
            return self.display
        if src.file.startswith("/") or "://" in src.file:
            return src.file
        return self.st.show(src.file)

    def parent_show(self, name: str) -> str:
        return self.parent.show(name) if self.parent else name


def load(location: str, profile: str | None, maps: list[str], steps: int = 4) -> ReconcileView:
    if type(steps) is not int or not 1 <= steps <= 10_000:   # the CLI and the API alike (0 or less: no simulation)
        raise UsageError("--steps must be between 1 and 10000")
    overrides = prof.parse_overrides(maps or [])
    if profile and profile not in prof.profiles():
        raise UsageError(f"--profile {profile!r}: known profiles: {', '.join(prof.profiles())}")
    if re.search(r"\.(json|ya?ml)$", location) and not _is_dir(location):
        head, _, base = location.rstrip("/").rpartition("/")
        st = open_location(head or ".")
        if st.stat(base) is None:
            raise InputError(f"{location}: no such file")
        rs = prof.load_state_file(st, base)
        return ReconcileView(rs, st, None, st.show(base), state_file=base, steps=steps)
    st = open_location(location)
    files = {e.name for e in st.listdir("") if not e.is_dir}
    chosen = prof.profiles()[profile] if profile else prof.detect(files)
    if chosen is None:  # maybe a run root: the step the framework resumes from (its family's rule)
        step_dir = _resume_step(st)
        if step_dir is not None:
            sub = st.sub(step_dir)
            sfiles = {e.name for e in sub.listdir("") if not e.is_dir}
            chosen = prof.detect(sfiles)
            if chosen:
                rs = prof.map_checkpoint(sub, chosen, overrides, parent=st, name=step_dir)
                return ReconcileView(rs, sub, st, sub.display, steps=steps)
        raise InputError(f"{st.display}: no known RL checkpoint here (no run_state/v1 file, no "
                         f"{' / '.join(sorted({f for p in prof.profiles().values() for f in p.detect_files}))}); "
                         f"pass --profile or a run-state file")
    name = st.display.rstrip("/").rsplit("/", 1)[-1]
    parent = _parent(location)
    rs = prof.map_checkpoint(st, chosen, overrides, parent=parent, name=name)
    return ReconcileView(rs, st, parent, st.display, steps=steps)


def _is_dir(location: str) -> bool:
    return os.path.isdir(location) if "://" not in location else False


def _resume_step(st: Storage) -> str | None:
    frameworks = {p.framework for p in prof.profiles().values()}
    try:
        found = locate(st)
    except OSError:
        return None
    if found.run is None or found.run.layout.family not in frameworks:
        return None
    return found.run.resume_target


def _parent(location: str) -> Storage | None:
    loc = location.rstrip("/")
    head = loc.rpartition("/")[0]
    if not head or head.endswith(":/") or head.endswith(":"):
        return None
    try:
        return open_location(head)
    except Exception:  # noqa: BLE001 - the parent is context only
        return None


def run(view: ReconcileView, engine: Engine, simulate: bool = False) -> None:
    rep = engine.report
    engine.run_scope("reconcile", view)
    p = view.pos
    rep.facts["positions"] = {"num_prompts_per_step": p.n, "lookahead": p.lookahead, "trainer_version": p.t,
                              "cursor": p.c, "dataloader_admitted": p.a,
                              "buffer_targets": {str(t): c for t, c in sorted(p.cnt.items())}}
    rep.facts["profile"] = view.rs.get("source.profile")
    plan = view.plan
    rep.facts["repair"] = {"available": plan.safe, "new_cursor": plan.new_cursor, "reason": plan.reason}
    if simulate:
        before = p.simulate(steps=view.steps)
        rep.facts["simulation"] = before.to_json() if before else None
        if plan.safe and plan.after is not None:
            rep.facts["simulation_after_repair"] = plan.after.to_json()


# ---- --fix ----------------------------------------------------------------------------------
def run_and_fix(location: str, make_engine, *, profile: str | None, maps: list[str], steps: int,
                simulate: bool, fix_it: bool, fix_output: str | None, say) -> Engine:
    """The whole subcommand: judge, and with `fix_it` apply the proven-safe repair, then judge the
    repaired state again (keeping the simulation that justified the write).  `make_engine()` gives a
    fresh engine per judgement; `say(line)` reports to the user.  Returns the engine whose report
    is the verdict."""
    view = load(location, profile, maps, steps)
    eng = make_engine()
    run(view, eng, simulate=simulate or fix_it)
    if not fix_it:
        return eng
    if not view.plan.safe:
        say(f"reconcile --fix: no automatic repair: {view.plan.reason}")
        return eng
    written, backup, change = fix(view, fix_output)
    say(f"fixed {written}: {change}" + (f" (backup: {backup})" if backup else ""))
    if fix_output:
        eng.report.facts["fixed"] = {"file": written, "backup": None, "change": change}
        return eng
    before = eng.report.facts
    eng = make_engine()
    run(load(location, profile, maps, steps), eng, simulate=True)
    eng.report.facts["fixed"] = {"file": written, "backup": backup, "change": change}
    eng.report.facts["simulation_before_fix"] = before.get("simulation")
    return eng


def fix(view: ReconcileView, output: str | None = None) -> tuple[str, str | None, str]:
    """Apply the safe cursor repair.  Returns (written file, backup or None, message)."""
    plan = view.plan
    if not plan.safe:
        raise UsageError(f"reconcile --fix: nothing safe to repair: {plan.reason}")
    src = view.rs.source("sampler.cursor")
    if view.state_file:
        fname, path = view.state_file, "sampler.cursor"
    elif view.rs.get("sampler.cursor_source") == "saved" and src.kind == "file" and src.path:
        fname, path = src.file, src.path
    else:
        raise UsageError("reconcile --fix: the cursor is not stored in the checkpoint (it is derived from "
                         f"{view.rs.provenance.get('sampler.cursor') or 'the trainer version'}), so there is "
                         "nothing to rewrite; the framework version that wrote it needs the code fix")
    if not fname.endswith((".json", ".yaml", ".yml")):
        raise UsageError(f"reconcile --fix: the cursor lives in {fname}, which ckptdoctor does not rewrite")
    if not isinstance(view.st, LocalStorage) and output is None:
        raise UsageError(f"reconcile --fix: {view.st.display} is not a local directory; pass "
                         f"--fix-output FILE to write the repaired {fname} elsewhere")
    raw = view.st.read(fname, prof.MAX_JSON_BYTES)
    is_json = fname.endswith(".json")
    doc = json.loads(raw) if is_json else load_yaml_bounded(raw)
    _set(doc, path, plan.new_cursor)
    data = (json.dumps(doc, indent=2) + "\n").encode() if is_json else \
        yaml.safe_dump(doc, sort_keys=False).encode()
    if output:
        replace_file(output, data)
        return output, None, plan.reason
    target = view.st.abspath(fname)
    d = os.path.dirname(target)
    if not os.access(d, os.W_OK):
        raise InputError(f"reconcile --fix: {d} is not writable; pass --fix-output FILE")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    backup = f"{target}.ckptdoctor-bak-{stamp}"
    try:
        write_new(backup, raw)
        # re-read just before the rename: a concurrent writer's change is never silently lost
        replace_file(target, data, before_rename=lambda: _unchanged(view.st, fname, raw))
    except OSError as exc:
        raise InputError(f"reconcile --fix: cannot write {target}: {exc.strerror or exc}") from None
    return target, backup, plan.reason


def _unchanged(st, fname: str, raw: bytes) -> None:
    if st.read(fname, prof.MAX_JSON_BYTES) != raw:
        raise UsageError(f"reconcile --fix: {st.show(fname)} changed while being repaired; nothing written "
                         f"(run it again)")


def _set(doc, path: str, value) -> None:
    parts = path.split(".")
    cur = doc
    for k in parts[:-1]:
        if not isinstance(cur, dict) or not isinstance(cur.get(k), dict):
            raise UsageError(f"reconcile --fix: cannot locate {path} in the file")
        cur = cur[k]
    if not isinstance(cur, dict) or parts[-1] not in cur:
        raise UsageError(f"reconcile --fix: {path} is not in the file; refusing to invent it")
    cur[parts[-1]] = value
