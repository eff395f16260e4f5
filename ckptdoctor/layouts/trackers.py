"""Tracker files ("which checkpoint is latest"): parsed the way each framework parses them, and
rendered the way each framework writes them.  The spec comes from the family description."""
from __future__ import annotations

import json
from ..values import value

from ..io.fs import Entry
from .spec import Layout, TrackerSpec

MAX_TRACKER_BYTES = 64 << 10
MAX_INT_DIGITS = 4300   # CPython's default int_max_str_digits: int() of a longer string raises ValueError


@value(frozen=True)
class TrackerValue:
    raw: str
    target: str | None  # checkpoint directory name the framework will load
    problem: str | None = None


@value(frozen=True)
class TrackerState:
    """A run root's tracker as found: its spec (None: the family has none), the directory entry
    (None: absent) and the parsed value (None: absent, or not a regular file)."""
    spec: TrackerSpec | None
    entry: Entry | None = None
    value: TrackerValue | None = None

    @property
    def target(self) -> str | None:
        v = self.value
        return v.target if v is not None and v.problem is None else None


def parse(layout: Layout, raw_bytes: bytes) -> TrackerValue:
    """spec.parse: int | int-or-release | tag | json:<key>."""
    spec = layout.tracker
    kind = spec.parse
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return TrackerValue(repr(raw_bytes[:40]), None, "tracker is not UTF-8 text")
    stripped = text.strip()
    if not stripped:
        return TrackerValue(text, None, "tracker is empty (a crash while writing it in place)")
    if kind in ("int", "int-or-release"):
        if kind == "int-or-release" and stripped == "release":
            return TrackerValue(text, spec.release_dir or "release")
        # exactly what Megatron-LM's and verl's `int(text.strip())` accept: a sign, `_` between digits,
        # any Unicode decimal digits ("+200", "2_00" and "٢٠٠" are iteration 200); more digits than
        # CPython converts (4300) raise there too, and are refused here before int() is asked
        try:
            if len(stripped) > MAX_INT_DIGITS:
                raise ValueError
            step = int(stripped)
        except ValueError:
            return TrackerValue(text, None, f"tracker holds {stripped[:40]!r}"
                                f"{'...' if len(stripped) > 40 else ''}, not an iteration number")
        if step < 0:
            return TrackerValue(text, None, f"tracker holds a negative iteration {step}")
        return TrackerValue(text, layout.tracker_dir(str(step)))
    if kind == "tag":
        if "/" in stripped or stripped in (".", "..") or "\n" in stripped:
            return TrackerValue(text, None, f"tracker tag {stripped[:40]!r} is not a directory name")
        return TrackerValue(text, stripped)
    if kind.startswith("json:"):
        key = kind.split(":", 1)[1]
        try:
            doc = json.loads(stripped)
            val = doc[key] if isinstance(doc, dict) else None
        except (ValueError, KeyError, RecursionError):
            return TrackerValue(text, None, f"tracker is not JSON with a {key!r} field")
        if val is None:
            return TrackerValue(text, None, f"tracker field {key!r} is null")
        return TrackerValue(text, layout.tracker_dir(str(val)))
    raise ValueError(f"unknown tracker parse kind {kind!r}")


def parse_link(storage, file: str, entry: Entry) -> TrackerValue:
    """A tracker that is a symbolic link (Composer's `latest-rank0.pt -> ep0-ba4-rank0.pt`): the
    framework loads whatever it points to, so its target is the checkpoint it names.  A link into
    another directory is refused: a copy of the run would resume from what the old place holds."""
    import os
    if not entry.is_link and entry.is_file:
        # a copy that followed links (cp -L, rsync -L): the framework loads the file itself (Composer
        # 0.32.1 resumed from such a copy, measured), so it is the checkpoint the run resumes from
        return TrackerValue("", file)
    if not entry.is_link:
        kind = "a directory" if entry.is_dir else "a special file"
        return TrackerValue("", None, f"{file} is {kind}, not the symbolic link the framework writes")
    try:
        raw = storage.readlink(file)
    except OSError as exc:
        return TrackerValue("", None, f"cannot read the link {file}: {exc.strerror or exc}")
    head, name = os.path.split(raw)
    root = getattr(storage, "root", None)
    if head in ("", ".") or (root and os.path.isabs(raw) and os.path.realpath(head) == os.path.realpath(root)):
        return TrackerValue(raw, name) if name not in ("", ".", "..") else \
            TrackerValue(raw, None, f"{file} points to {raw!r}, not a checkpoint")
    return TrackerValue(raw, None, f"{file} points to {raw!r}, outside the run root: a copy of the run "
                                   f"resumes from whatever that path holds there")


def render(layout: Layout, dirname: str) -> str:
    """What the framework's own writer puts in the tracker for checkpoint `dirname`."""
    fields = layout.steps.fields(dirname) if layout.steps else None
    if fields is None or layout.tracker is None or layout.tracker.content is None:
        raise ValueError(f"{dirname!r} is not a {layout.family} checkpoint name")
    vals = {k: (int(v) if k == "step" else v) for k, v in fields.items()}
    return layout.tracker.content.format(**vals)
