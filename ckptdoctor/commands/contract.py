"""`ckptdoctor contract init|check|new-phase` and the contract part of preflight."""
from __future__ import annotations

import os
from ..values import value, field

from .. import contract as C
from ..engine.runner import Engine


@value
class ContractSubject:
    """What the 5xx contract rules judge: one run root's contract and the disk now."""
    path: str
    contract: C.Contract | None
    error: str | None
    total_steps: int | None = None
    quick_data: bool = False
    _changes: list[C.Change] | None = field(default=None, repr=False)

    @property
    def display(self) -> str:
        return self.path

    @property
    def phase_index(self) -> int | None:
        return self.contract.newest.index if self.contract else None

    @property
    def phase_reason(self) -> str | None:
        return self.contract.newest.reason if self.contract else None

    def changes(self, kind: str) -> list[C.Change]:
        if self.contract is None:
            return []
        if self._changes is None:
            self._changes = C.compare(self.contract.newest, self.total_steps, self.quick_data)
        return [c for c in self._changes if c.kind == kind]


def subject(run_root: str, total_steps: int | None = None, quick_data: bool = False) -> ContractSubject:
    path = C.path_in(run_root)
    try:
        return ContractSubject(path, C.load(path), None, total_steps, quick_data)
    except C.ContractError as exc:
        return ContractSubject(path, None, str(exc), total_steps, quick_data)


def evaluate(engine: Engine, sub: ContractSubject) -> None:
    engine.run_scope("contract", sub)
    if sub.contract:
        ph = sub.contract.newest
        engine.report.facts["contract"] = {
            "path": sub.path, "phases": len(sub.contract.phases), "phase": ph.index, "reason": ph.reason,
            "total_steps": ph.total_steps, "data_files": len(ph.data.get("files", {})),
            "recipe_files": len(ph.recipe), "code": C.code_str(ph.code) if ph.code else None,
            "changes": len(sub._changes or []), "data_compared": "size and mtime, re-hashed when they differ"
            if sub.quick_data else "content (xxh3-128)"}


def check(run_root: str, engine: Engine, total_steps: int | None) -> None:
    if not os.path.isfile(C.path_in(run_root)) and not os.path.lexists(C.path_in(run_root)):
        from ..engine.errors import InputError
        raise InputError(f"{run_root}: no {C.NAME} (create one with `ckptdoctor contract init`)")
    evaluate(engine, subject(run_root, total_steps))


def describe(c: C.Contract) -> str:
    ph = c.newest
    code = C.code_str(ph.code) if ph.code else "no code recorded"
    return (f"{c.path}: phase {ph.index} ({ph.reason}): {code}; {len(ph.data.get('files', {}))} data file(s); "
            f"{len(ph.recipe)} recipe file(s); total steps {ph.total_steps}")


def written(engine: Engine, c: C.Contract, say=None) -> None:
    """init / new-phase: the phase just written, as facts (and one line on stderr)."""
    ph = c.newest
    engine.report.facts["written"] = {"path": c.path, "phase": ph.index, "reason": ph.reason,
                                      "code": C.code_str(ph.code) if ph.code else None,
                                      "data_files": len(ph.data.get("files", {})), "recipe_files": len(ph.recipe),
                                      "total_steps": ph.total_steps}
    if say:
        say(f"ckptdoctor: contract {'written' if ph.index == 0 else 'phase added'}: {describe(c)}")
