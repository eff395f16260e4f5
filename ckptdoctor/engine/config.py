"""Settings from config files and options: the same knobs on the command line and in TOML.

Discovery (closest wins, no merging, like ruff): --config FILE, else $CKPTDOCTOR_CONFIG,
else the nearest ckptdoctor.toml / .ckptdoctor.toml / pyproject.toml with [tool.ckptdoctor]
found walking up from the current directory.  --isolated ignores every config file.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError

KEYS = {"select", "ignore", "extend-select", "fail-on", "severity", "verify", "publish", "reconcile",
        "preflight"}


@dataclass
class Settings:
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    fail_on: str = "error"
    severity: dict[str, str] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-subcommand tables
    source: str | None = None

    def option(self, command: str, key: str, default=None):
        return self.options.get(command, {}).get(key, default)


def _read_toml(path: Path, table: str | None) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from None
    if table:
        doc = doc.get("tool", {}).get(table)
    return doc


def discover(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    cur = (start or Path.cwd()).resolve()
    for d in (cur, *cur.parents):
        for name in ("ckptdoctor.toml", ".ckptdoctor.toml"):
            p = d / name
            if p.is_file():
                return p, _read_toml(p, None) or {}
        p = d / "pyproject.toml"
        if p.is_file():
            doc = _read_toml(p, "ckptdoctor")
            if doc is not None:
                return p, doc
    return None


def load(config: str | None, isolated: bool) -> Settings:
    s = Settings()
    if isolated:
        return s
    found: tuple[Path, dict[str, Any]] | None = None
    explicit = config or os.environ.get("CKPTDOCTOR_CONFIG")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise UsageError(f"{p}: config file not found")
        table = "ckptdoctor" if p.name == "pyproject.toml" else None
        found = (p, _read_toml(p, table) or {})
    else:
        found = discover()
    if found:
        path, doc = found
        apply(s, doc, str(path))
    return s


def apply(s: Settings, doc: dict[str, Any], source: str) -> None:
    unknown = set(doc) - KEYS
    if unknown:
        raise UsageError(f"{source}: unknown config key(s): {', '.join(sorted(unknown))}")
    if "select" in doc:
        s.select = _strlist(doc["select"], source, "select")
    if "extend-select" in doc:
        s.select = s.select + _strlist(doc["extend-select"], source, "extend-select")
    if "ignore" in doc:
        s.ignore = _strlist(doc["ignore"], source, "ignore")
    if "fail-on" in doc:
        s.fail_on = str(doc["fail-on"])
    if "severity" in doc:
        if not isinstance(doc["severity"], dict):
            raise UsageError(f"{source}: 'severity' must be a table of RULE = \"error|warning|info\"")
        s.severity.update({str(k): str(v) for k, v in doc["severity"].items()})
    for cmd in ("verify", "publish", "reconcile", "preflight"):
        if isinstance(doc.get(cmd), dict):
            s.options[cmd] = {k.replace("-", "_"): v for k, v in doc[cmd].items()}
    s.source = source


def _strlist(v, source, key) -> list[str]:
    if isinstance(v, str):
        return [x for x in v.replace(",", " ").split() if x]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise UsageError(f"{source}: '{key}' must be a list of rule ids or names")
