"""Tracker files ("which checkpoint is latest"), parsed the way each framework parses them."""
from __future__ import annotations

import json
from dataclasses import dataclass

MAX_TRACKER_BYTES = 64 << 10


@dataclass
class TrackerValue:
    raw: str
    target: str | None  # checkpoint directory name the framework will load
    problem: str | None = None


def parse(spec: dict, raw_bytes: bytes, dir_fmt) -> TrackerValue:
    """spec['parse']: int | int-or-release | tag | json:<key>."""
    kind = spec.get("parse", "int")
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return TrackerValue(repr(raw_bytes[:40]), None, "tracker is not UTF-8 text")
    stripped = text.strip()
    if not stripped:
        return TrackerValue(text, None, "tracker is empty (a crash while writing it in place)")
    if kind in ("int", "int-or-release"):
        if kind == "int-or-release" and stripped == "release":
            return TrackerValue(text, spec.get("release_dir", "release"))
        try:
            step = int(stripped)
        except ValueError:
            return TrackerValue(text, None, f"tracker holds {stripped[:40]!r}, not an iteration number")
        if step < 0:
            return TrackerValue(text, None, f"tracker holds a negative iteration {step}")
        return TrackerValue(text, dir_fmt(str(step)))
    if kind == "tag":
        if "/" in stripped or stripped in (".", ".."):
            return TrackerValue(text, None, f"tracker tag {stripped[:40]!r} is not a directory name")
        return TrackerValue(text, stripped)
    if kind.startswith("json:"):
        key = kind.split(":", 1)[1]
        try:
            doc = json.loads(stripped)
            val = doc[key] if isinstance(doc, dict) else None
        except (ValueError, KeyError):
            return TrackerValue(text, None, f"tracker is not JSON with a {key!r} field")
        if val is None:
            return TrackerValue(text, None, f"tracker field {key!r} is null")
        return TrackerValue(text, dir_fmt(str(val)))
    raise ValueError(f"unknown tracker parse kind {kind!r}")
