"""`ckptdoctor digests diff A B`: which items of which ranks differ between two digest sets."""
from __future__ import annotations

import os
import re
from ..values import value, field

from .. import resume
from ..engine.errors import InputError
from ..engine.runner import Engine

RANK_FILE = re.compile(r"^rank_(\d{5,})\.json$")


@value
class DigestsDiff:
    a: str
    b: str
    by_rank: dict[int, tuple] = field(default_factory=dict)   # rank -> (differing, only_a, only_b, detail)
    ranks_missing: dict[int, str] = field(default_factory=dict)

    @property
    def display(self) -> str:
        return self.b


def load_set(where: str) -> dict[int, resume.DigestSet]:
    d = os.path.join(where, resume.DIR) if os.path.isdir(os.path.join(where, resume.DIR)) else where
    if not os.path.isdir(d):
        raise InputError(f"{where}: not a checkpoint with {resume.DIR}/ nor a digest directory")
    out = {}
    for name in sorted(os.listdir(d)):
        m = RANK_FILE.match(name)
        if m:
            try:
                ds = resume.load(os.path.join(d, name))
            except ValueError as exc:
                raise InputError(str(exc)) from None
            out[ds.rank] = ds
    if not out:
        raise InputError(f"{d}: no rank_NNNNN.json digest files")
    return out


def diff(a: str, b: str, engine: Engine) -> DigestsDiff:
    sa, sb = load_set(a), load_set(b)
    res = DigestsDiff(a, b)
    for r in sorted(set(sa) | set(sb)):
        if r not in sb:
            res.ranks_missing[r] = a
        elif r not in sa:
            res.ranks_missing[r] = b
        else:
            res.by_rank[r] = resume.compare(sa[r].items, sb[r].items)
    engine.run_scope("digests", res)
    engine.report.facts["a"], engine.report.facts["b"] = a, b
    engine.report.facts["ranks"] = {"compared": len(res.by_rank), "only_in_one": len(res.ranks_missing),
                                    "differing": sum(1 for v in res.by_rank.values() if any(v[:3]))}
    engine.report.facts["items"] = sum(len(sa[r].items) for r in res.by_rank)
    return res
