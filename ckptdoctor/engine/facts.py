"""Typed per-command facts: what a subcommand found besides its findings (the run-root table, the
resume target, the publish result...), one class per command.

Renderers and callers read them by attribute (`facts.resume_from`) or, for compatibility with the
JSON shape, by key (`facts["resume_from"]`).  Only declared fields exist: writing an unknown key
is an error, so a typo cannot invent a fact.  `to_json()` is the `facts` object of the JSON report
(a field left UNSET is omitted: those keys appear only when the command produced them).

Declared like dataclasses (an annotated field with the default UNSET each), collected by
`__init_subclass__` instead of `@dataclass`: building a dataclass costs ~0.8 ms of start-up, and
every command imported all eight (issue 20).
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any


class _Unset:
    def __repr__(self):
        return "UNSET"


UNSET: Any = _Unset()


class Facts:
    FIELDS: tuple = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.FIELDS = cls.FIELDS + tuple(n for n in cls.__dict__.get("__annotations__", {}) if n != "FIELDS")

    def __init__(self, **values: Any):
        for key, value in values.items():
            self[key] = value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.to_json() == self.to_json()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.to_json().items())})"

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.FIELDS:
            raise KeyError(f"{type(self).__name__} has no fact {key!r}")
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.FIELDS and getattr(self, key) is not UNSET

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS if getattr(self, f) is not UNSET}


class VerifyFacts(Facts):
    kind: Any = UNSET                 # "run" | "checkpoint"
    layout: Any = UNSET
    slice: Any = UNSET                # {"k", "n", "units", "bytes"} with --slice
    checkpoints: Any = UNSET          # table rows (of the checkpoints judged)
    not_judged: Any = UNSET           # --target resume: older checkpoints the gate had no need to judge
    newest_complete: Any = UNSET
    resume_from: Any = UNSET
    target: Any = UNSET               # "all" | "resume"
    fixed: Any = UNSET                # verify --fix: the plan applied
    pruned: Any = UNSET               # prune: {"dry_run", "removed", "kept"}
    gate: Any = UNSET                 # --target resume: {"passed", "resume_from", "why"}, judged with every rule
    hidden: Any = UNSET               # {rule: count} of findings judged but hidden by --select/--ignore/config
    contract: Any = UNSET             # --target resume: the run contract the gate checked, when there is one
    checked: Any = UNSET              # what was checked: {"checkpoints", "files", "bytes", "compared", "seconds"}


class PublishFacts(Facts):
    source: Any = UNSET
    published: Any = UNSET
    refused: Any = UNSET


class ReconcileFacts(Facts):
    positions: Any = UNSET
    profile: Any = UNSET
    repair: Any = UNSET
    simulation: Any = UNSET
    simulation_after_repair: Any = UNSET
    fixed: Any = UNSET
    simulation_before_fix: Any = UNSET


class PreflightFacts(Facts):
    nodes: Any = UNSET
    world: Any = UNSET
    allocation_nodes: Any = UNSET     # nodes of the allocation (`nodes` rows: only this node with --local)
    checkpoints: Any = UNSET
    resume_from: Any = UNSET
    newest_reachable: Any = UNSET
    local: Any = UNSET
    contract: Any = UNSET             # the run contract, when the run root has one
    view: Any = UNSET                 # --local: this node's view, for `preflight --views`
    views: Any = UNSET                # --views: how many node views were judged, and from where


class MergeFacts(Facts):
    merged_slices: Any = UNSET
    bytes_hashed: Any = UNSET
    units_hashed: Any = UNSET


class ContractFacts(Facts):
    contract: Any = UNSET             # the newest phase and what was compared
    written: Any = UNSET              # init / new-phase: the phase written


class DigestsFacts(Facts):
    a: Any = UNSET
    b: Any = UNSET
    ranks: Any = UNSET
    items: Any = UNSET


class ManifestFacts(Facts):
    manifest: Any = UNSET             # the manifest written
    files: Any = UNSET
    bytes: Any = UNSET


class ForensicsFacts(Facts):
    logs: Any = UNSET                 # {"files", "lines", "timestamps"}
    first_failure: Any = UNSET        # rank, ranks, host, path, errno, exception, message, time, log, line, chain...
    timed_out_ranks: Any = UNSET      # ranks that only failed after it (timeouts, lost peers, SIGTERM)
    checkpoint: Any = UNSET           # --run-root: {"path", "broken", "findings", "linked"}


ForensicsFacts.FIELDS += ("class",)   # file | memory | derived-state | launcher; a keyword, so declared by name
setattr(ForensicsFacts, "class", UNSET)


FACTS = {"verify": VerifyFacts, "prune": VerifyFacts, "publish": PublishFacts, "reconcile": ReconcileFacts,
         "preflight": PreflightFacts, "merge": MergeFacts, "contract": ContractFacts, "digests": DigestsFacts,
         "manifest": ManifestFacts, "forensics": ForensicsFacts}


def for_command(command: str) -> Facts:
    return FACTS[command]()
