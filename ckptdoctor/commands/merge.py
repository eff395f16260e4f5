"""`ckptdoctor merge`: combine `verify --slice K/N --format json` reports into one verdict.

Fails closed: every slice 0..N-1 of the same target must be present exactly once.
"""
from __future__ import annotations

import json

from ..engine.catalog import catalog
from ..engine.errors import UsageError
from ..engine.finding import Finding, Report


def merge(paths: list[str]) -> Report:
    docs = []
    for p in paths:
        try:
            with open(p, "rb") as fh:
                doc = json.load(fh)
        except OSError as exc:
            raise UsageError(f"{p}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"{p}: not a JSON report ({exc})") from None
        sl = (doc.get("facts") or {}).get("slice") if isinstance(doc, dict) else None
        if not sl or doc.get("version") != 1:
            raise UsageError(f"{p}: not a `verify --slice K/N --format json` report")
        docs.append((p, doc, sl))
    targets = {d["target"] for _, d, _ in docs}
    ns = {sl["n"] for _, _, sl in docs}
    if len(targets) != 1 or len(ns) != 1:
        raise UsageError(f"slice reports disagree on target or N: {sorted(targets)} / {sorted(ns)}")
    n = ns.pop()
    seen: dict[int, str] = {}
    for p, _, sl in docs:
        if sl["k"] in seen:
            raise UsageError(f"slice {sl['k']}/{n} given twice ({seen[sl['k']]}, {p})")
        seen[sl["k"]] = p
    missing = sorted(set(range(n)) - set(seen))
    if missing:
        raise UsageError(f"slices {missing} of {n} are missing: coverage incomplete, no verdict")
    rep = Report(command="verify", target=targets.pop())
    keys = set()
    cat = catalog()
    for _, d, _ in docs:
        for f in d["findings"]:
            key = (f["rule"], f["path"], f["message"])
            if key in keys:
                continue
            keys.add(key)
            rep.findings.append(Finding(rule=f["rule"], name=f.get("name") or cat[f["rule"]].name,
                                        severity=f["severity"], path=f["path"], message=f["message"],
                                        details=f.get("details") or {}, hint=f.get("hint")))
    rep.facts = {"merged_slices": n, "bytes_hashed": sum(sl.get("bytes", 0) for _, _, sl in docs),
                 "units_hashed": sum(sl.get("units", 0) for _, _, sl in docs)}
    return rep
