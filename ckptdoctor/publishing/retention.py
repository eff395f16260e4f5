"""--keep-last / --keep-every: prune older published checkpoints, only after the new one committed.

Never pruned: the tracker's target, the checkpoint just published (the newest verified one),
anything a framework or another publish is still writing (a staging sibling exists), and the
newest K / every M-th step.  Pruning renames to a trash name first (atomic: the checkpoint
disappears whole), fsyncs the parent, then deletes; a crash leaves only trash, which the next
publish removes.
"""
from __future__ import annotations

import os
import shutil
from ..values import value, field

from ..io.atomic import fsync_dir
from ..io.fs import remove_tree
from ..layouts.spec import Layout
from . import faults, naming


@value
class Pruned:
    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # name -> why


def plan(entries: list[str], layout: Layout, *, keep_last: int | None, keep_every: int | None,
         protect: dict[str, str], real_dir=None, keep_within: float | None = None,
         ages: dict[str, float | None] | None = None) -> Pruned:
    """`real_dir(name)`: is the entry a real directory (not a symlink, regular file or special file)?
    Anything else with a step name is left alone and said so: never renamed, followed or opened.
    `keep_within` (seconds) keeps every checkpoint younger than that by `ages` (seconds since its
    newest file); one whose age is unknown is kept."""
    steps = sorted(((layout.steps.step(e), e) for e in entries if layout.steps.step(e) is not None), reverse=True)
    res = Pruned()
    odd = {n for _, n in steps if real_dir is not None and not real_dir(n)}
    steps = [(s, n) for s, n in steps if n not in odd]
    for name in sorted(odd):
        res.kept[name] = ("a checkpoint file: prune removes checkpoint directories only, and leaves it alone"
                          if layout.steps.files else
                          "not a checkpoint directory (a symlink, a regular file or a special file): left alone")
    for i, (step, name) in enumerate(steps):
        why = protect.get(name)
        if why is None and keep_last is not None and i < keep_last:
            why = f"one of the newest {keep_last}"
        if why is None and keep_every and step % keep_every == 0:
            why = f"step {step} is a multiple of {keep_every}"
        if why is None and keep_within is not None:
            age = (ages or {}).get(name)
            if age is None:
                why = "its age is unknown (kept under --keep-within)"
            elif age <= keep_within:
                why = f"written within the last {duration_text(keep_within)}"
        if why is None:
            staging = [e for e in naming.staging_for(layout, name, entries) if not _dead_publish(e)]
            if staging:
                why = f"still being written ({staging[0]})"
        if why is None and keep_last is None and not keep_every and keep_within is None:
            why = "no retention policy given"
        if why:
            res.kept[name] = why
        else:
            res.removed.append(name)
    return res


_UNITS = {"s": 1, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """`7d`, `36h`, `1w2d`, `90min`, `45s` -> seconds.  A bare `m` is refused: minutes or months?"""
    import re
    t = text.strip().lower()
    parts = re.findall(r"(\d+)\s*(min|[smhdw])", t)
    if not t or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", t):
        raise ValueError(f"{text!r}: a duration is numbers with units s, min, h, d, w (e.g. 7d, 36h, 1w2d)")
    if any(u == "m" for _, u in parts):
        raise ValueError(f"{text!r}: write min for minutes (m could be months)")
    return float(sum(int(n) * _UNITS[u] for n, u in parts))


def duration_text(seconds: float) -> str:
    for u in ("w", "d", "h", "min"):
        if seconds >= _UNITS[u] and seconds % _UNITS[u] == 0:
            return f"{int(seconds // _UNITS[u])}{u}"
    return f"{int(seconds)}s"


def prune(root: str, names: list[str]) -> None:
    entries = os.listdir(root)
    for name in names:
        for e in entries:  # leftovers of dead publishes of a pruned checkpoint go with it
            own = naming.parse_own(e)
            if own and own["name"] == name and _dead_publish(e):
                shutil.rmtree(os.path.join(root, e), ignore_errors=True)  # a dead publish's few temps
        trash = os.path.join(root, naming.trash_name(name))
        os.rename(os.path.join(root, name), trash)
        fsync_dir(root)
        faults.point("prune")
        remove_tree(trash)   # a checkpoint's thousands of shards: unlinks together on a networked filesystem
    if names:
        fsync_dir(root)


def _dead_publish(entry: str) -> bool:
    """A temp of a ckptdoctor publish whose process is gone (this host) is not 'being written'."""
    own = naming.parse_own(entry)
    return bool(own) and (own["kind"] == "trash" or (own["host"] == naming.HOST and not naming.owner_alive(own)))
