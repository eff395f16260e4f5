"""`ckptdoctor.run_state/v1`: a framework-neutral description of an RL run's resume state.

Every field is nullable: absent or null means *unknown*, never 0, and rules that need an unknown
field say they could not decide instead of guessing.  `provenance` maps a field to the file and
key its value came from, so findings can quote their evidence.
"""
from __future__ import annotations

import json
from ..values import value, field
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from ..engine.errors import InputError

SCHEMA = "ckptdoctor.run_state/v1"

INT, STR, BOOL, LIST = "int", "str", "bool", "list"
COUNT = "positive int"   # a per-step count: 0 or less is no count at all (the simulation divides by it)
FIELDS: dict[str, dict[str, str]] = {
    "source": {"framework": STR, "profile": STR, "checkpoint": STR},
    "config": {"num_prompts_per_step": COUNT, "group_size": COUNT, "sampler": STR,
               "max_lookahead_versions": INT, "max_staleness_versions": INT, "buffer_capacity": INT,
               "on_dropped_prompt": STR, "replacement_reserve_prompts": INT, "batches_per_epoch": INT},
    "trainer": {"step": INT, "version": INT, "epoch": INT, "consumed_prompts": INT},
    "sampler": {"cursor": INT, "cursor_source": STR, "name": STR},
    "dataloader": {"batches_in_epoch": INT, "iterator_finished": BOOL, "batches_total": INT,
                   "diverted_batches": INT},
    "buffer": {"groups": LIST, "manifest_digest": STR},
    "inflight": {"persisted": BOOL, "groups": LIST},
    "reserve": {"prompts": INT},
    "capture": {"cursor_with_dataloader": BOOL, "buffer_with_cursor": BOOL},
    "data_plane": {"manifest_digest": STR, "group_count": INT, "train_steps": INT,
                   "trainer_version": INT, "epoch": INT, "sampler_name": STR},
    "run": {"checkpoint_step": INT, "latest_status_step": INT, "steps": LIST, "staging": LIST},
}
GROUP_FIELDS = {"id": STR, "target_step": INT, "status": STR, "start_version": INT,
                "end_version": INT, "size": INT, "prompt_id": None}
STATUSES = ("ready", "inflight", "reserved", "admitted", "finalized")
CURSOR_SOURCES = ("saved", "derived", "restored_targets", "absent")


@value(frozen=True)
class Provenance:
    """Where a field's value came from, parsed once from its provenance string (the run_state/v1
    form: 'FILE:PATH', 'derived...', 'fallback...', 'default...', 'directory name NAME')."""
    kind: str                 # file | derived | fallback | default | dirname | none
    file: str | None = None
    path: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> "Provenance":
        if not text:
            return cls("none")
        for kind in ("derived", "fallback", "default"):
            if text.startswith(kind):
                return cls(kind)
        if text.startswith("directory name "):
            return cls("dirname", path=text[len("directory name "):])
        scheme = text.find("://")
        colon = text.find(":", scheme + 3 if scheme >= 0 else 0)  # a URL keeps its scheme's colon
        if colon > 0:
            return cls("file", text[:colon], text[colon + 1:])
        return cls("file", text, None)


@value
class RunState:
    doc: dict[str, Any]
    origin: str  # the file or directory it came from
    provenance: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # mapping problems worth a finding

    def get(self, dotted: str, default=None):
        sec, _, key = dotted.partition(".")
        v = (self.doc.get(sec) or {}).get(key)
        return default if v is None else v

    def where(self, dotted: str) -> str:
        return self.provenance.get(dotted) or f"{self.origin}:{dotted}"

    def source(self, dotted: str) -> Provenance:
        return Provenance.parse(self.provenance.get(dotted))

    @property
    def groups(self) -> list[dict]:
        return list(self.get("buffer.groups") or [])

    @property
    def inflight_groups(self) -> list[dict]:
        return list(self.get("inflight.groups") or []) if self.get("inflight.persisted") else []

    def to_json(self) -> dict:
        return {"schema": SCHEMA, **self.doc, "provenance": dict(sorted(self.provenance.items()))}


def _typed(value: Any, kind: str | None, where: str) -> Any:
    if value is None or kind is None:
        return value
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    ok = {INT: is_int, COUNT: lambda v: is_int(v) and v > 0,
          STR: lambda v: isinstance(v, str), BOOL: lambda v: isinstance(v, bool),
          LIST: lambda v: isinstance(v, list)}[kind]
    if kind in (INT, COUNT) and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not ok(value):
        raise InputError(f"{where}: expected {kind}, got {json.dumps(value, default=str)[:60]}")
    return value


def normalize(raw: dict, origin: str) -> RunState:
    """Validate types section by section; unknown sections are kept out, unknown keys refused."""
    if not isinstance(raw, dict):
        raise InputError(f"{origin}: a run-state must be a mapping with schema: {SCHEMA}")
    if raw.get("schema") != SCHEMA:
        raise InputError(f"{origin}: schema is {raw.get('schema')!r}, expected {SCHEMA!r}")
    doc: dict[str, Any] = {}
    for sec, spec in FIELDS.items():
        given = raw.get(sec) or {}
        if not isinstance(given, dict):
            raise InputError(f"{origin}: {sec} must be a mapping")
        extra = set(given) - set(spec)
        if extra:
            raise InputError(f"{origin}: {sec}: unknown field(s) {', '.join(sorted(extra))} "
                             f"(known: {', '.join(spec)})")
        doc[sec] = {k: _typed(given.get(k), t, f"{origin}: {sec}.{k}") for k, t in spec.items()}
    for sec in ("buffer", "inflight"):
        doc[sec]["groups"] = [_group(g, f"{origin}: {sec}.groups[{i}]")
                              for i, g in enumerate(doc[sec]["groups"] or [])]
    cs = doc["sampler"]["cursor_source"]
    if cs is not None and cs.split("(")[0].strip() not in CURSOR_SOURCES:   # "derived (trainer.version - 1)"
        raise InputError(f"{origin}: sampler.cursor_source {cs!r}: use one of {', '.join(CURSOR_SOURCES)}")
    prov = raw.get("provenance") or {}
    if not isinstance(prov, dict):
        raise InputError(f"{origin}: provenance must be a mapping of field -> 'file:key'")
    return RunState(doc, origin, {str(k): str(v) for k, v in prov.items()})


def _group(g: Any, where: str) -> dict:
    if not isinstance(g, dict):
        raise InputError(f"{where}: a group must be a mapping")
    extra = set(g) - set(GROUP_FIELDS)
    if extra:
        raise InputError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    out = {k: _typed(g.get(k), t, f"{where}.{k}") for k, t in GROUP_FIELDS.items()}
    if out["status"] is not None and out["status"] not in STATUSES:
        raise InputError(f"{where}.status {out['status']!r}: use one of {', '.join(STATUSES)}")
    return out
