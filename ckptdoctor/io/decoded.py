"""Budgets for decoded data: a tiny hostile file must not expand into a huge value.

YAML aliases and pickle memo references turn a few hundred bytes into a graph that shares nodes;
anything that walks it as a tree (path lookups, JSON output) then visits billions of values.  So
every decoded run-state value is measured once, as the tree a walk would see, with a node and a
depth budget, before anything else touches it; and YAML refuses alias counts no hand-written file
needs.  Measured: a 905-byte billion-laughs file needs 90 aliases; real configs use a handful.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing is imported by type checkers only: ~5 ms of start-up (issue 20)
if TYPE_CHECKING:
    from typing import Any

import yaml

MAX_ALIASES = 64
MAX_NODES = 2_000_000     # a run-state file with a few thousand groups is ~100k values
MAX_DEPTH = 64

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class TooLarge(ValueError):
    pass


def load_yaml_bounded(raw: bytes) -> Any:
    """safe_load, refusing more than MAX_ALIASES aliases (counted by the C parser, no composing)."""
    import io
    aliases = 0
    for ev in yaml.parse(io.BytesIO(raw) if isinstance(raw, (bytes, bytearray)) else raw, Loader=_Loader):
        if isinstance(ev, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise TooLarge(f"more than {MAX_ALIASES} YAML aliases (an alias bomb?); refused")
    return yaml.load(raw, Loader=_Loader)


def check_size(obj: Any, what: str = "value", max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """Raise TooLarge when walking `obj` as a tree would visit more than max_nodes values or go
    deeper than max_depth; returns obj.  Iterative: no recursion limit to hit."""
    stack = [(obj, 0)]
    seen = 0
    while stack:
        cur, depth = stack.pop()
        seen += 1
        if seen > max_nodes:
            raise TooLarge(f"{what} expands to more than {max_nodes} values (shared references?); refused")
        if depth > max_depth:
            raise TooLarge(f"{what} is nested more than {max_depth} levels deep; refused")
        if isinstance(cur, dict):
            stack.extend((v, depth + 1) for v in cur.values())
        elif isinstance(cur, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in cur)
        elif hasattr(cur, "__dict__") and not isinstance(cur, type):
            stack.extend((v, depth + 1) for v in vars(cur).values())
    return obj
