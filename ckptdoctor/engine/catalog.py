"""The rule catalog: rules/*.yaml, one file per rule (id, name, severity, why, fix, ...).

The YAML is the single source of rule documentation: `ckptdoctor rules ID`, SARIF rule
metadata and the man pages all render from it.
"""
from __future__ import annotations

import functools
import os
import re
from ..values import value, field
from pathlib import Path

from .errors import UsageError

ID_RE = re.compile(r"^CKD\d{3}$")
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
AREAS = {"1": "verify", "2": "publish", "3": "reconcile", "4": "preflight", "5": "resume", "6": "forensics", "9": "tool"}
REQUIRED = ("id", "name", "severity", "subcommands", "summary", "why", "fix")

@functools.lru_cache(maxsize=1)
def data_dir() -> Path:
    """rules/ in a source checkout, ckptdoctor/_rules in an installed wheel (resolved once)."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "_rules", here.parent / "rules"):
        if cand.is_dir():
            return cand
    raise UsageError("ckptdoctor: cannot find the rules/ catalog next to the package")


def parse_yaml(data: bytes):
    import yaml  # only when the compiled cache (engine/yamlcache.py) cannot serve: ~25 ms of start-up
    return yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_yaml(path: Path):
    """A shipped YAML file, parsed (through the compiled cache); any other path is parsed directly.
    The returned document is shared: callers read it, never change it."""
    root = data_dir()
    p = str(path)
    if p.startswith(f"{root}/") and "/../" not in p and "/./" not in p:
        rel = p[len(str(root)) + 1:]   # the usual call: a path built from data_dir(); no resolve()
    else:
        try:
            rel = str(Path(path).resolve().relative_to(root))
        except ValueError:
            rel = None
    if rel is not None:
        from . import yamlcache
        doc = yamlcache.docs(root).get(rel, yamlcache.MISSING)
        if doc is not yamlcache.MISSING:
            return doc
    with open(path, "rb") as fh:
        return parse_yaml(fh.read())


@value(frozen=True)
class Rule:
    id: str
    name: str
    severity: str
    subcommands: tuple[str, ...]
    summary: str
    why: str
    fix: str
    example: str = ""
    references: tuple[str, ...] = field(default_factory=tuple)
    locked: bool = False   # cannot be deselected or downgraded (the run contract)
    unverified: bool = False  # its error says "could not be verified" (no manifest, no digest set),
                              # not "broken": it fails the command but never makes a checkpoint incomplete

    @property
    def area(self) -> str:
        return AREAS.get(self.id[3], "?")


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    root = data_dir()
    for name in sorted(n for n in os.listdir(root) if n.startswith("CKD") and n.endswith(".yaml")):
        path = root / name
        doc = load_yaml(path)
        missing = [k for k in REQUIRED if k not in (doc or {})]
        if missing:
            raise UsageError(f"{path}: rule entry lacks {', '.join(missing)}")
        if not ID_RE.match(doc["id"]) or not NAME_RE.match(doc["name"]):
            raise UsageError(f"{path}: bad id or name {doc['id']!r} {doc['name']!r}")
        if doc["severity"] not in ("error", "warning", "info"):
            raise UsageError(f"{path}: bad severity {doc['severity']!r}")
        rules[doc["id"]] = Rule(
            id=doc["id"], name=doc["name"], severity=doc["severity"],
            subcommands=tuple(doc["subcommands"]), summary=doc["summary"].strip(),
            why=doc["why"].strip(), fix=doc["fix"].strip(), example=(doc.get("example") or "").strip(),
            references=tuple(doc.get("references") or ()), locked=doc.get("locked") is True,
                                 unverified=doc.get("unverified") is True)
    return rules


def by_name() -> dict[str, Rule]:
    return {r.name: r for r in catalog().values()}


def lookup(key: str) -> Rule | None:
    key = key.strip()
    return catalog().get(key.upper()) or by_name().get(key.lower())
