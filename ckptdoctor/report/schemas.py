"""JSON Schemas (draft 2020-12) for what ckptdoctor writes: the report (`--format json` of every
judging subcommand), `ckptdoctor.run_state/v1` and `ckptdoctor.read_plan/v1`.  Built from the same tables the code validates
with (the catalog's rule ids, run_state's FIELDS), so they cannot drift; `ckptdoctor schema NAME`
prints them and the tests validate real outputs against them."""
from __future__ import annotations

TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from ..engine.finding import SEVERITIES

def report() -> dict[str, Any]:
    from ..engine.catalog import catalog
    finding = {"type": "object", "additionalProperties": False,
               "required": ["rule", "name", "severity", "path", "message", "details", "hint"],
               "properties": {"rule": {"enum": sorted(catalog())}, "name": {"type": "string"},
                              "severity": {"enum": list(SEVERITIES)}, "path": {"type": "string"},
                              "message": {"type": "string"}, "details": {"type": "object"},
                              "hint": {"type": ["string", "null"]}}}
    single = {
            "type": "object", "additionalProperties": False,
            "required": ["version", "command", "target", "root", "config", "findings", "summary", "facts"],
            "properties": {
                "version": {"const": 1},
                "command": {"enum": ["verify", "publish", "reconcile", "preflight", "prune", "contract", "digests",
                                     "manifest", "forensics"]},
                "target": {"type": "string", "description": "the location as given"},
                "root": {"type": "string", "description": "the location as an absolute path (or URL)"},
                "config": {"type": ["string", "null"], "description": "the config file that applied"},
                "findings": {"type": "array", "items": finding},
                "summary": {"type": "object", "additionalProperties": False, "required": list(SEVERITIES),
                            "properties": {s: {"type": "integer", "minimum": 0} for s in SEVERITIES}},
                "facts": {"type": "object", "description": "per-command facts (resume target, table rows, ...)"}}}
    counts = {"type": "object", "additionalProperties": False, "required": list(SEVERITIES),
              "properties": {s: {"type": "integer", "minimum": 0} for s in SEVERITIES}}
    many = {"type": "object", "additionalProperties": False, "required": ["version", "command", "reports", "summary",
                                                                          "failed"],
            "description": "`verify|prune|manifest PATH PATH...`: one report per path, the totals, the paths that failed",
            "properties": {"version": {"const": 1}, "command": {"enum": ["verify", "prune", "manifest"]},
                           "reports": {"type": "array", "minItems": 2, "items": single}, "summary": counts,
                           "failed": {"type": "array", "items": {"type": "string"}}}}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://ckptdoctor/schemas/report-v1.json", "title": "ckptdoctor report (version 1)",
            "oneOf": [single, many]}


def run_state() -> dict[str, Any]:
    from ..runstate.schema import BOOL, COUNT, FIELDS, GROUP_FIELDS, INT, LIST, SCHEMA, STATUSES, STR
    nullable = {INT: {"type": ["integer", "null"]}, COUNT: {"type": ["integer", "null"], "minimum": 1},
                 STR: {"type": ["string", "null"]}, BOOL: {"type": ["boolean", "null"]},
                 LIST: {"type": ["array", "null"]}}   # keyed by the kinds the reader checks, so they cannot drift
    group = {"type": "object", "additionalProperties": False,
             "properties": {k: (nullable[t] if t else {}) for k, t in GROUP_FIELDS.items()}}
    group["properties"]["status"] = {"enum": [*STATUSES, None]}
    props: dict[str, Any] = {"schema": {"const": SCHEMA},
                             "provenance": {"type": "object", "additionalProperties": {"type": "string"}}}
    for sec, spec in FIELDS.items():
        fields = {k: dict(nullable[t]) for k, t in spec.items()}
        if "groups" in fields:
            fields["groups"]["items"] = group
        props[sec] = {"type": ["object", "null"], "additionalProperties": False, "properties": fields}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://ckptdoctor/schemas/run-state-v1.json", "title": SCHEMA,
            "description": "Every field is nullable: absent or null means unknown, never 0.",
            "type": "object", "required": ["schema"], "additionalProperties": False, "properties": props}


def read_plan() -> dict[str, Any]:
    from ..preflight.readsets import READ_PLAN_SCHEMA
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://ckptdoctor/schemas/read-plan-v1.json", "title": READ_PLAN_SCHEMA,
            "description": "Which ranks held each key in their local save plans, before deduplication: a rank "
                           "of the same world reads exactly the keys it held. Written by "
                           "ckptdoctor.integrations.dcp.ManifestWriter as the manifest's `read_plan`; "
                           "`preflight --read-plan FILE` reads it bare or inside a manifest.",
            "type": "object", "required": ["schema", "world", "keys"], "additionalProperties": False,
            "properties": {
                "schema": {"const": READ_PLAN_SCHEMA},
                "world": {"type": "integer", "minimum": 1, "description": "ranks of the save"},
                "keys": {"type": "object", "description": "fqn (DCP's flattened key) -> its holders",
                         "additionalProperties": {"oneOf": [
                             {"const": "all", "description": "every rank of the save"},
                             {"type": "array", "minItems": 1, "uniqueItems": True,
                              "items": {"type": "integer", "minimum": 0}}]}}}}


SCHEMAS = {"report": report, "run-state": run_state, "read-plan": read_plan}
