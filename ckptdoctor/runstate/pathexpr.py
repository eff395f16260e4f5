"""The tiny path language of mapping profiles: data lookups, never code.

    current_step                      dotted keys (dict keys or object fields)
    groups[*]  groups[0]              every element / one element of a list
    len(meta.sample_ids)  len(.)      length of what the path names ('.' is the whole file)
    _snapshot._snapshot_step + _steps_since_snapshot    sums and differences of the above
    'ready'  3                        literals

A path that names nothing yields MISSING (unknown), never 0.  There is no eval: a profile can
only read.
"""
from __future__ import annotations

import re
TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

from ..io.unpickle import Bag

MISSING = object()
_TOKEN = re.compile(r"\s*(?:(?P<num>-?\d+)|(?P<str>'[^']*')|(?P<len>len\()|(?P<op>[+\-)])|"
                    r"(?P<path>\.|[A-Za-z_:][\w:\-]*(?:\.[A-Za-z_:][\w:\-]*|\[\*\]|\[\d+\])*))")


class PathError(ValueError):
    pass


def _step(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, MISSING)
    if isinstance(obj, Bag):
        return obj.__dict__.get(key, MISSING)
    return MISSING


def get_path(obj: Any, path: str) -> Any:
    """Follow one path; MISSING if any part is absent.  `[*]` maps over a list."""
    if path == ".":
        return obj
    parts = re.findall(r"\[\*\]|\[\d+\]|[^.\[\]]+", path)
    return _walk(obj, parts)


def _walk(obj: Any, parts: list[str]) -> Any:
    for i, p in enumerate(parts):
        if obj is MISSING or obj is None:
            return MISSING
        if p == "[*]":
            if not isinstance(obj, (list, tuple)):
                return MISSING
            return [_walk(x, parts[i + 1:]) for x in obj]
        if p.startswith("["):
            idx = int(p[1:-1])
            if not isinstance(obj, (list, tuple)) or idx >= len(obj):
                return MISSING
            obj = obj[idx]
            continue
        obj = _step(obj, p)
    return obj


def evaluate(obj: Any, expr: str, lookup=None) -> Any:
    """Evaluate `expr` against `obj`; `lookup(name)` resolves names outside the file (fallbacks
    refer to canonical fields such as `trainer.version`)."""
    pos, terms, ops = 0, [], ["+"]
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise PathError(f"cannot parse path expression {expr!r} at {expr[pos:]!r}")
        pos = m.end()
        if m.group("op") in ("+", "-"):
            ops.append(m.group("op"))
            continue
        if m.group("num") is not None:
            num = m.group("num")
            if num.startswith("-") and len(terms) == len(ops):   # after a term, `len(g)-1` subtracts
                ops.append("-")
                num = num[1:]
            terms.append(int(num))
        elif m.group("str") is not None:
            terms.append(m.group("str")[1:-1])
        elif m.group("len"):
            close = expr.find(")", pos)
            if close < 0:
                raise PathError(f"unclosed len( in {expr!r}")
            inner = get_path(obj, expr[pos:close].strip())
            terms.append(len(inner) if isinstance(inner, (list, tuple, dict, str)) else MISSING)
            pos = close + 1
        elif m.group("path"):
            p = m.group("path")
            v = get_path(obj, p)
            if v is MISSING and lookup is not None:
                v = lookup(p)
            terms.append(v)
        else:
            raise PathError(f"unexpected ')' in {expr!r}")
    if len(terms) != len(ops):
        raise PathError(f"malformed path expression {expr!r}")
    if len(terms) == 1:
        return terms[0]
    total = 0
    for op, t in zip(ops, terms):
        if t is MISSING or t is None or isinstance(t, bool) or not isinstance(t, int):
            return MISSING
        total = total + t if op == "+" else total - t
    return total
