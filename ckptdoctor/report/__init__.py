"""Renderers: text for humans (stdout), json and sarif for machines, one line per finding for logs
and CI (concise, github, gitlab: lines.py).  One Report in, text out."""
from __future__ import annotations

FORMATS = ("text", "json", "sarif", "concise", "github", "gitlab")


def render(report, fmt: str, out) -> None:
    if fmt == "json":
        from .json_out import render as r
    elif fmt == "sarif":
        from .sarif import render as r
    elif fmt in ("concise", "github", "gitlab"):
        from . import lines
        r = getattr(lines, fmt)
    else:
        from .text import render as r
    r(report, out)
