"""Typed per-command facts: what a subcommand found besides its findings (the run-root table, the
resume target, the publish result...), one dataclass per command.

Renderers and callers read them by attribute (`facts.resume_from`) or, for compatibility with the
JSON shape, by key (`facts["resume_from"]`).  Only declared fields exist: writing an unknown key
is an error, so a typo cannot invent a fact.  `to_json()` is the `facts` object of the JSON report
(a field left UNSET is omitted: those keys appear only when the command produced them).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


class _Unset:
    def __repr__(self):
        return "UNSET"


UNSET: Any = _Unset()


@dataclass
class Facts:
    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in {f.name for f in fields(self)}:
            raise KeyError(f"{type(self).__name__} has no fact {key!r}")
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in {f.name for f in fields(self)} and getattr(self, key) is not UNSET

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not UNSET}


@dataclass
class VerifyFacts(Facts):
    kind: Any = UNSET                 # "run" | "checkpoint"
    layout: Any = UNSET
    slice: Any = UNSET                # {"k", "n", "units", "bytes"} with --slice
    checkpoints: Any = UNSET          # table rows
    newest_complete: Any = UNSET
    resume_from: Any = UNSET
    target: Any = UNSET               # "all" | "resume"
    fixed: Any = UNSET                # verify --fix: the plan applied
    pruned: Any = UNSET               # prune: {"dry_run", "removed", "kept"}


@dataclass
class PublishFacts(Facts):
    source: Any = UNSET
    published: Any = UNSET
    refused: Any = UNSET


@dataclass
class ReconcileFacts(Facts):
    positions: Any = UNSET
    profile: Any = UNSET
    repair: Any = UNSET
    simulation: Any = UNSET
    simulation_after_repair: Any = UNSET
    fixed: Any = UNSET
    simulation_before_fix: Any = UNSET


@dataclass
class PreflightFacts(Facts):
    nodes: Any = UNSET
    world: Any = UNSET
    checkpoints: Any = UNSET
    resume_from: Any = UNSET
    newest_reachable: Any = UNSET
    local: Any = UNSET
    contract: Any = UNSET             # the run contract, when the run root has one
    view: Any = UNSET                 # --local: this node's view, for `preflight --views`
    views: Any = UNSET                # --views: how many node views were judged, and from where


@dataclass
class MergeFacts(Facts):
    merged_slices: Any = UNSET
    bytes_hashed: Any = UNSET
    units_hashed: Any = UNSET


@dataclass
class ContractFacts(Facts):
    contract: Any = UNSET             # the newest phase and what was compared
    written: Any = UNSET              # init / new-phase: the phase written


@dataclass
class DigestsFacts(Facts):
    a: Any = UNSET
    b: Any = UNSET
    ranks: Any = UNSET
    items: Any = UNSET


FACTS = {"verify": VerifyFacts, "prune": VerifyFacts, "publish": PublishFacts, "reconcile": ReconcileFacts,
         "preflight": PreflightFacts, "merge": MergeFacts, "contract": ContractFacts, "digests": DigestsFacts}


def for_command(command: str) -> Facts:
    return FACTS[command]()
