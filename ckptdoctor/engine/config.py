"""Settings from config files and options: the same knobs on the command line and in TOML.

Discovery (closest wins, no merging, like ruff): --config FILE, else $CKPTDOCTOR_CONFIG,
else the nearest ckptdoctor.toml / .ckptdoctor.toml / pyproject.toml with [tool.ckptdoctor]
found walking up from the current directory.  --isolated ignores every config file.
"""
from __future__ import annotations

import os
from ..values import value, field
from pathlib import Path
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from .errors import UsageError

KEYS = {"select", "ignore", "extend-select", "fail-on", "severity", "verify", "publish", "reconcile",
        "preflight", "acknowledge"}


@value(frozen=True)
class Ack:
    """`[[acknowledge]]`: a known, accepted finding -- this rule, in checkpoints matching this glob --
    shown as info with its reason until the date (then it counts again, and says it expired)."""
    checkpoint: str
    rule: str
    reason: str
    until: str | None = None      # YYYY-MM-DD, inclusive
    source: str = ""

    def expired(self, today: str) -> bool:
        return self.until is not None and today > self.until

    def matches(self, rule: str, path: str) -> bool:
        if rule != self.rule:
            return False
        import fnmatch
        parts = path.replace("\\", "/").rstrip("/").split("/")
        # the glob names a checkpoint (directory) or a path: any run of the path's components may match
        return any(fnmatch.fnmatchcase("/".join(parts[i:j]), self.checkpoint)
                   for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))


@value(frozen=True)
class Option:
    """One typed key of a per-subcommand table; the command-line option of the same name wins."""
    type: type
    minimum: float | None = None
    help: str = ""

    def check(self, value: Any, where: str) -> Any:
        ok = isinstance(value, self.type) and not (self.type is not bool and isinstance(value, bool))
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise UsageError(f"{where}: expected {_TYPE_NAMES[self.type]}, got {type(value).__name__} "
                             f"{value!r}")
        if self.minimum is not None and value < self.minimum:
            raise UsageError(f"{where}: must be at least {self.minimum:g}, got {value!r}")
        return value


_TYPE_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}

# Every key a [verify] / [publish] / [reconcile] / [preflight] table may hold.  Unknown keys and
# wrong types are errors (exit 2) naming the file, table and key: a typo never silently does nothing.
OPTIONS: dict[str, dict[str, Option]] = {
    "verify": {"mtime-tolerance": Option(float, 0, "seconds a shard may be newer than its marker"),
               "num-experts": Option(int, 1, "expected expert count (CKD109)"),
               "checksums": Option(bool, None, "always re-hash against the manifest"),
               "workers": Option(int, 1, "hashing threads")},
    "publish": {"workers": Option(int, 1, "parallel file copies"),
                "keep-last": Option(int, 1, "retention: keep the newest K"),
                "keep-every": Option(int, 1, "retention: also keep every M-th step")},
    "reconcile": {"steps": Option(int, 1, "trainer steps to simulate")},
    "preflight": {"ranks-per-node": Option(str, None, "ranks per node, N or Slurm's '4(x3),2'"),
                  "mem-per-node": Option(str, None, "host memory per node, e.g. 512G (Slurm: bare = MiB)"),
                  "memory-copy-factor": Option(float, 0, "host-memory model: copies of the loaded bytes"),
                  "memory-pinned": Option(bool, None, "host-memory model: pinned buffers rounded to 2^k")},
}


@value
class Settings:
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    fail_on: str = "error"
    severity: dict[str, str] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-subcommand tables, validated
    source: str | None = None
    acknowledge: list = field(default_factory=list)   # [Ack]


def _read_toml(path: Path, table: str | None) -> dict[str, Any] | None:
    try:  # imported here: 4 ms of start-up that only a run with a config file needs
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, packaged as tomli
        import tomli as tomllib
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


def _mentions_us(path: Path) -> bool:
    """Can this pyproject.toml hold [tool.ckptdoctor]?  Any spelling of that table names us, so a
    file that never says "ckptdoctor" is not parsed (importing tomllib and parsing a project's
    pyproject cost ~7 ms of every command run inside a Python project).  Unreadable: parse it, and
    let _read_toml say why."""
    try:
        with open(path, "rb") as fh:
            return b"ckptdoctor" in fh.read(4 << 20)
    except OSError:
        return True


def discover(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    cur = (start or Path.cwd()).resolve()
    for d in (cur, *cur.parents):
        for name in ("ckptdoctor.toml", ".ckptdoctor.toml"):
            p = d / name
            if p.is_file():
                return p, _read_toml(p, None) or {}
        p = d / "pyproject.toml"
        if p.is_file() and _mentions_us(p):
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
        if doc["fail-on"] not in ("error", "warning", "info"):
            raise UsageError(f"{source}: fail-on {doc['fail-on']!r}: use error, warning or info")
        s.fail_on = doc["fail-on"]
    if "severity" in doc:
        if not isinstance(doc["severity"], dict):
            raise UsageError(f"{source}: 'severity' must be a table of RULE = \"error|warning|info\"")
        for k, v in doc["severity"].items():
            if v not in ("error", "warning", "info"):
                raise UsageError(f"{source}: [severity] {k} = {v!r}: use error, warning or info")
        s.severity.update({str(k): str(v) for k, v in doc["severity"].items()})
    if "acknowledge" in doc:
        s.acknowledge = _acks(doc["acknowledge"], source)
    for cmd, known in OPTIONS.items():
        if cmd not in doc:
            continue
        table = doc[cmd]
        if not isinstance(table, dict):
            raise UsageError(f"{source}: [{cmd}] must be a table")
        opts: dict[str, Any] = {}
        for k, v in table.items():
            if k not in known:
                raise UsageError(f"{source}: [{cmd}] unknown key {k!r} (known: {', '.join(sorted(known))})")
            opts[k.replace("-", "_")] = known[k].check(v, f"{source}: [{cmd}] {k}")
        s.options[cmd] = opts
    s.source = source


def _acks(v, source: str) -> list[Ack]:
    import re
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise UsageError(f"{source}: 'acknowledge' must be an array of tables ([[acknowledge]])")
    out = []
    for i, t in enumerate(v, 1):
        where = f"{source}: [[acknowledge]] #{i}"
        extra = set(t) - {"checkpoint", "rule", "reason", "until"}
        if extra:
            raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        for k in ("checkpoint", "rule", "reason"):
            if not isinstance(t.get(k), str) or not t[k].strip():
                raise UsageError(f"{where}: '{k}' is required (a non-empty string)")
        if not re.fullmatch(r"CKD\d{3}", t["rule"]):
            raise UsageError(f"{where}: rule {t['rule']!r} is not a rule id (CKDnnn)")
        until = t.get("until")
        if until is not None:
            until = str(until)  # TOML dates arrive as datetime.date
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", until):
                raise UsageError(f"{where}: until {until!r}: a date, YYYY-MM-DD")
        out.append(Ack(t["checkpoint"], t["rule"], t["reason"].strip(), until, source))
    return out


def _strlist(v, source, key) -> list[str]:
    if isinstance(v, str):
        return [x for x in v.replace(",", " ").split() if x]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise UsageError(f"{source}: '{key}' must be a list of rule ids or names")
