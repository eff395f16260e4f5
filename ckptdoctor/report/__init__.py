"""Renderers: text for humans (stdout), json and sarif for machines.  One Report in, text out."""
from __future__ import annotations

FORMATS = ("text", "json", "sarif")


def render(report, fmt: str, out) -> None:
    if fmt == "json":
        from .json_out import render as r
    elif fmt == "sarif":
        from .sarif import render as r
    else:
        from .text import render as r
    r(report, out)
